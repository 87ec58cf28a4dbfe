// The CUDA implementation of src/cuda/device.h (built when CMake finds the CUDA toolkit).
#include <cuda_runtime.h>

#include <atomic>
#include <map>
#include <mutex>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cuda/convert_kernel.h"
#include "cuda/device.h"
#include "image/convert.h"

namespace feedline::cuda {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e)));
}

#define FEEDLINE_CUDA_RETURN(expr)                      \
  do {                                                  \
    cudaError_t _e = (expr);                            \
    if (_e != cudaSuccess) return CudaError(_e, #expr); \
  } while (0)

class PinnedAllocator final : public HostAllocator {
 public:
  explicit PinnedAllocator(int device) : device_(device) {}
  void* Allocate(size_t bytes) override {
    cudaSetDevice(device_);
    void* p = nullptr;
    if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) throw std::bad_alloc();
    return p;
  }
  void Free(void* p, size_t) override { cudaFreeHost(p); }
  const char* name() const override { return "cudaHostAlloc"; }

 private:
  int device_;
};

// One device buffer: the uint8 staging copy, the converted images and the labels.
struct Buffer {
  void* memory = nullptr;
  size_t bytes = 0;
  uint8_t* staging = nullptr;
  void* images = nullptr;
  int64_t* labels = nullptr;
  cudaEvent_t start = nullptr, ready = nullptr, released = nullptr;
  bool has_release = false;
  bool timed = false;  // start/ready hold a measurement not yet read
};

class CudaCopyStage;

class CudaDeviceBatch final : public internal::DeviceBatch {
 public:
  CudaDeviceBatch(CudaCopyStage* stage, std::shared_ptr<CudaCopyStage> keep, Buffer* buffer)
      : stage_(stage), keep_(std::move(keep)), buffer_(buffer) {}
  ~CudaDeviceBatch() override;
  absl::Status UseOnStream(void* stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    stream_ = static_cast<cudaStream_t>(stream);
    FEEDLINE_CUDA_RETURN(cudaStreamWaitEvent(stream_, buffer_->ready, 0));
    return absl::OkStatus();
  }

 private:
  CudaCopyStage* stage_;
  std::shared_ptr<CudaCopyStage> keep_;
  Buffer* buffer_;
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;  // legacy default stream unless told otherwise
};

class CudaCopyStage final : public CopyStage, public std::enable_shared_from_this<CudaCopyStage> {
 public:
  CudaCopyStage(int device, int64_t batch_size, int size, DType dtype, Layout layout,
                Normalization norm)
      : device_(device),
        batch_size_(batch_size),
        hw_(int64_t(size) * size),
        dtype_(dtype),
        layout_(layout),
        norm_(norm) {}
  ~CudaCopyStage() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    for (Buffer* b : all_) {
      cudaEventDestroy(b->start);
      cudaEventDestroy(b->ready);
      cudaEventDestroy(b->released);
      cudaFree(b->memory);
      delete b;
    }
    cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    FEEDLINE_CUDA_RETURN(cudaSetDevice(device_));
    FEEDLINE_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> Submit(
      std::shared_ptr<internal::BatchSlot> slot, int64_t n) override {
    FEEDLINE_CUDA_RETURN(cudaSetDevice(device_));
    absl::StatusOr<Buffer*> buffer = Acquire();
    if (!buffer.ok()) return buffer.status();
    Buffer* b = *buffer;
    if (b->has_release) FEEDLINE_CUDA_RETURN(cudaStreamWaitEvent(stream_, b->released, 0));
    FEEDLINE_CUDA_RETURN(cudaEventRecord(b->start, stream_));
    FEEDLINE_CUDA_RETURN(cudaMemcpyAsync(b->staging, slot->images, size_t(n * hw_ * 3),
                                         cudaMemcpyHostToDevice, stream_));
    FEEDLINE_CUDA_RETURN(cudaMemcpyAsync(b->labels, slot->labels.data(),
                                         size_t(n) * sizeof(int64_t), cudaMemcpyHostToDevice,
                                         stream_));
    const int kind = dtype_ == DType::kFloat32    ? kConvertFloat32
                     : dtype_ == DType::kFloat16  ? kConvertFloat16
                     : dtype_ == DType::kBFloat16 ? kConvertBFloat16
                                                  : kConvertUint8;
    FEEDLINE_CUDA_RETURN(LaunchConvert(b->staging, b->images, n, hw_, layout_ == Layout::kNCHW,
                                       kind, norm_.scale, norm_.bias, stream_));
    FEEDLINE_CUDA_RETURN(cudaEventRecord(b->ready, stream_));
    b->timed = true;
    auto batch = std::make_shared<CudaDeviceBatch>(this, shared_from_this(), b);
    batch->images = b->images;
    batch->labels = b->labels;
    batch->device = device_;
    batch->ready_event = b->ready;
    batch->host = std::move(slot);
    batches_.fetch_add(1);
    return std::shared_ptr<internal::DeviceBatch>(std::move(batch));
  }

  void Release(Buffer* b, cudaStream_t consumer) {
    cudaSetDevice(device_);
    // Reuse only after the consumer's work queued so far, and after our own copy.
    if (cudaEventRecord(b->released, consumer) == cudaSuccess) b->has_release = true;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
  }

  int64_t device_bytes() const override {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t total = 0;
    for (Buffer* b : all_) total += int64_t(b->bytes);
    return total;
  }
  double copy_ms() const override {
    std::lock_guard<std::mutex> lock(mu_);
    double total = copy_ms_;
    for (Buffer* b : all_) {
      float ms = 0;
      if (b->timed && cudaEventQuery(b->ready) == cudaSuccess &&
          cudaEventElapsedTime(&ms, b->start, b->ready) == cudaSuccess) {
        total += ms;
      }
    }
    return total;
  }
  int64_t batches() const override { return batches_.load(); }

 private:
  absl::StatusOr<Buffer*> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        Buffer* b = free_.back();
        free_.pop_back();
        float ms = 0;
        if (b->timed && cudaEventSynchronize(b->ready) == cudaSuccess &&
            cudaEventElapsedTime(&ms, b->start, b->ready) == cudaSuccess) {
          copy_ms_ += ms;
        }
        b->timed = false;
        return b;
      }
    }
    auto b = std::make_unique<Buffer>();
    const size_t staging = size_t(batch_size_ * hw_ * 3);
    const size_t images = size_t(batch_size_ * hw_ * 3) * size_t(ElementSize(dtype_));
    const size_t labels = size_t(batch_size_) * sizeof(int64_t);
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    b->bytes = align(staging) + align(images) + labels;
    FEEDLINE_CUDA_RETURN(cudaMalloc(&b->memory, b->bytes));
    b->staging = static_cast<uint8_t*>(b->memory);
    b->images = static_cast<uint8_t*>(b->memory) + align(staging);
    b->labels = reinterpret_cast<int64_t*>(static_cast<uint8_t*>(b->memory) + align(staging) +
                                           align(images));
    FEEDLINE_CUDA_RETURN(cudaEventCreate(&b->start));
    FEEDLINE_CUDA_RETURN(cudaEventCreate(&b->ready));
    FEEDLINE_CUDA_RETURN(cudaEventCreateWithFlags(&b->released, cudaEventDisableTiming));
    std::lock_guard<std::mutex> lock(mu_);
    all_.push_back(b.get());
    return b.release();
  }

  const int device_;
  const int64_t batch_size_;
  const int64_t hw_;
  const DType dtype_;
  const Layout layout_;
  const Normalization norm_;
  cudaStream_t stream_ = nullptr;
  mutable std::mutex mu_;
  std::vector<Buffer*> all_;
  std::vector<Buffer*> free_;
  double copy_ms_ = 0;
  std::atomic<int64_t> batches_{0};
};

CudaDeviceBatch::~CudaDeviceBatch() {
  // The pinned host slot may return to the ring only once the copy from it is done.
  cudaEventSynchronize(buffer_->ready);
  host.reset();
  stage_->Release(buffer_, stream_);
}

}  // namespace

bool Compiled() { return true; }

std::vector<DeviceInfo> Devices(std::string* why_none) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  std::vector<DeviceInfo> out;
  if (e != cudaSuccess) {
    if (why_none)
      *why_none = absl::StrCat("no CUDA device/driver available: ", cudaGetErrorString(e));
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back(DeviceInfo{i, p.name, int64_t(p.totalGlobalMem), p.major * 10 + p.minor});
  }
  if (out.empty() && why_none) *why_none = "no CUDA device found";
  return out;
}

absl::Status CheckDevice(int index) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return absl::FailedPreconditionError(
        absl::StrCat("device: cuda:", index, " requested, but no CUDA device/driver is available (",
                     cudaGetErrorString(e), "); use device=\"cpu\""));
  }
  if (index >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device: cuda:", index, " requested, but this machine has ", count, " CUDA device(s)"));
  }
  return absl::OkStatus();
}

HostAllocator* PinnedHostAllocator(int device) {
  static std::mutex mu;
  static std::map<int, PinnedAllocator*>* allocators = new std::map<int, PinnedAllocator*>();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = allocators->try_emplace(device, nullptr);
  if (inserted) it->second = new PinnedAllocator(device);
  return it->second;
}

absl::StatusOr<std::unique_ptr<CopyStage>> CopyStage::Create(int device, int64_t batch_size,
                                                             int size, DType dtype, Layout layout,
                                                             const std::array<double, 3>& mean,
                                                             const std::array<double, 3>& std) {
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  // Owned through a shared_ptr (device batches keep the stage alive); the unique_ptr handed
  // out holds a forwarding shell.
  auto stage = std::make_shared<CudaCopyStage>(device, batch_size, size, dtype, layout,
                                               Normalization::From(mean, std));
  if (absl::Status s = stage->Init(); !s.ok()) return s;
  class Shell final : public CopyStage {
   public:
    explicit Shell(std::shared_ptr<CudaCopyStage> s) : s_(std::move(s)) {}
    absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> Submit(
        std::shared_ptr<internal::BatchSlot> slot, int64_t n) override {
      return s_->Submit(std::move(slot), n);
    }
    int64_t device_bytes() const override { return s_->device_bytes(); }
    double copy_ms() const override { return s_->copy_ms(); }
    int64_t batches() const override { return s_->batches(); }

   private:
    std::shared_ptr<CudaCopyStage> s_;
  };
  return std::unique_ptr<CopyStage>(new Shell(std::move(stage)));
}

}  // namespace feedline::cuda
