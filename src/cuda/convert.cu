// The conversion kernel: uint8 NHWC on the device -> normalised float32 / float16 / bfloat16
// (or uint8) in NCHW or NHWC. x * scale[c] + bias[c] is computed with explicit round-to-nearest
// multiply and add (no fused multiply-add), as the CPU twin (src/image/convert.cc) computes it,
// so the two agree exactly in float32 and to within the final rounding in 16-bit types.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/convert_kernel.h"

namespace feedline::cuda {
namespace {

template <typename T>
__device__ __forceinline__ T Store(float v);
template <>
__device__ __forceinline__ float Store<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half Store<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 Store<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

struct Params {
  float scale[3];
  float bias[3];
};

// The grid is (blocks over one image's pixels, images): blockIdx.y is the image, so no thread
// divides to find which image a pixel belongs to.
template <typename T>
__global__ void ConvertKernel(const uint8_t* __restrict__ src, T* __restrict__ dst, int64_t hw,
                              bool nchw, Params p) {
  const int64_t image = blockIdx.y;
  const uint8_t* s_image = src + 3 * image * hw;
  for (int64_t within = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; within < hw;
       within += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* s = s_image + 3 * within;
#pragma unroll
    for (int c = 0; c < 3; ++c) {
      const float v = __fadd_rn(__fmul_rn(float(s[c]), p.scale[c]), p.bias[c]);
      const int64_t at = nchw ? (image * 3 + c) * hw + within : 3 * (image * hw + within) + c;
      dst[at] = Store<T>(v);
    }
  }
}

__global__ void TransposeKernel(const uint8_t* __restrict__ src, uint8_t* __restrict__ dst,
                                int64_t hw) {
  const int64_t image = blockIdx.y;
  for (int64_t within = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; within < hw;
       within += int64_t(gridDim.x) * blockDim.x) {
    const uint8_t* s = src + 3 * (image * hw + within);
#pragma unroll
    for (int c = 0; c < 3; ++c) dst[(image * 3 + c) * hw + within] = s[c];
  }
}

}  // namespace

cudaError_t CheckConvertKernel() {
  cudaFuncAttributes attributes;
  return cudaFuncGetAttributes(&attributes, ConvertKernel<float>);
}

cudaError_t LaunchConvert(const uint8_t* src, void* dst, int64_t images, int64_t hw, bool nchw,
                          int dtype, const float* scale, const float* bias, cudaStream_t stream) {
  const int64_t pixels = images * hw;
  if (pixels == 0) return cudaSuccess;
  if (images > 65535) return cudaErrorInvalidValue;  // gridDim.y's limit; batches are smaller
  const int threads = 256;
  const int64_t per_image = (hw + threads - 1) / threads;
  const dim3 blocks(unsigned(per_image < 4096 ? per_image : 4096), unsigned(images));
  Params p;
  for (int c = 0; c < 3; ++c) p.scale[c] = scale[c], p.bias[c] = bias[c];
  switch (dtype) {
    case kConvertUint8:
      if (nchw) {
        TransposeKernel<<<blocks, threads, 0, stream>>>(src, static_cast<uint8_t*>(dst), hw);
      } else {
        return cudaMemcpyAsync(dst, src, size_t(pixels) * 3, cudaMemcpyDeviceToDevice, stream);
      }
      break;
    case kConvertFloat32:
      ConvertKernel<float>
          <<<blocks, threads, 0, stream>>>(src, static_cast<float*>(dst), hw, nchw, p);
      break;
    case kConvertFloat16:
      ConvertKernel<__half>
          <<<blocks, threads, 0, stream>>>(src, static_cast<__half*>(dst), hw, nchw, p);
      break;
    case kConvertBFloat16:
      ConvertKernel<__nv_bfloat16>
          <<<blocks, threads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), hw, nchw, p);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

}  // namespace feedline::cuda
