// Launcher of the conversion kernel (src/cuda/convert.cu), callable from host C++.
#ifndef FEEDLINE_SRC_CUDA_CONVERT_KERNEL_H_
#define FEEDLINE_SRC_CUDA_CONVERT_KERNEL_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace feedline::cuda {

enum : int { kConvertUint8 = 0, kConvertFloat32 = 1, kConvertFloat16 = 2, kConvertBFloat16 = 3 };

// src: `images` uint8 NHWC images of `hw` pixels each, on the device. dst: the same images as
// `dtype` in NCHW (`nchw`) or NHWC, normalised with scale/bias per channel for float types.
cudaError_t LaunchConvert(const uint8_t* src, void* dst, int64_t images, int64_t hw, bool nchw,
                          int dtype, const float* scale, const float* bias, cudaStream_t stream);

// cudaSuccess when the current device can run the kernels (this build's sm_80/sm_90 code or
// its PTX); cudaErrorNoKernelImageForDevice (or another error) when it cannot.
cudaError_t CheckConvertKernel();

}  // namespace feedline::cuda

#endif  // FEEDLINE_SRC_CUDA_CONVERT_KERNEL_H_
