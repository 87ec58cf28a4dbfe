// The GPU side of the pipeline: device discovery, pinned host memory for the ring, and the copy
// stage (H2D copy on a dedicated non-blocking stream, the uint8 -> normalised conversion kernel,
// an event per batch, device buffers reused only after the consumer's work on them is done).
//
// Always compiled: without the CUDA toolkit (FEEDLINE_WITH_CUDA undefined) every entry point says
// that this build has no CUDA path; with it, the GPU is chosen at run time, and a machine without
// a GPU or driver gets kFailedPrecondition from `CheckDevice`, at once.
//
// Thread safety: `CopyStage::Submit` is called by the consumer thread; a `DeviceBatch`'s release
// may happen on any thread (the DLPack deleter).
#ifndef FEEDLINE_SRC_CUDA_DEVICE_H_
#define FEEDLINE_SRC_CUDA_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/options.h"
#include "pipeline/batch_slot.h"

namespace feedline {
namespace internal {

// A batch on the GPU: images (dtype, layout as asked) then labels (int64), in one buffer.
struct DeviceBatch {
  virtual ~DeviceBatch() = default;
  void* images = nullptr;
  int64_t* labels = nullptr;
  int device = 0;
  void* ready_event = nullptr;      // cudaEvent_t
  std::shared_ptr<BatchSlot> host;  // the pinned slot (indices stay on the host)
  // Makes `stream` (a cudaStream_t; null = the legacy default stream) wait for the batch, and
  // remembers it: the buffer is reused only after the work queued there at release is done.
  virtual absl::Status UseOnStream(void* stream) = 0;
};

}  // namespace internal

namespace cuda {

bool Compiled();
struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
  int compute_capability = 0;  // major * 10 + minor
};
// The GPUs a driver reports (empty without CUDA, a driver or a GPU), and why there are none.
std::vector<DeviceInfo> Devices(std::string* why_none = nullptr);

// "cpu" -> -1; "cuda" -> 0; "cuda:N" -> N. kInvalidArgument for anything else.
absl::StatusOr<int> ParseDevice(const std::string& device);
// kFailedPrecondition when device `index` cannot be used (no CUDA build, driver or device).
absl::Status CheckDevice(int index);

// Page-locked host memory (cudaHostAlloc) for the ring's slots; null without CUDA.
HostAllocator* PinnedHostAllocator(int device);

class CopyStage {
 public:
  virtual ~CopyStage() = default;
  // A stage for `device` converting batches of up to `batch_size` samples of size x size
  // (uint8 NHWC on the host) to `dtype`/`layout` on the device.
  static absl::StatusOr<std::unique_ptr<CopyStage>> Create(int device, int64_t batch_size, int size,
                                                           DType dtype, Layout layout,
                                                           const std::array<double, 3>& mean,
                                                           const std::array<double, 3>& std);
  // Enqueues the copy and conversion of the slot's first `n` samples; returns at once.
  virtual absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> Submit(
      std::shared_ptr<internal::BatchSlot> slot, int64_t n) = 0;
  // Device bytes this stage holds (its buffers).
  virtual int64_t device_bytes() const = 0;
  // Time the copy engine and kernel took, summed (ms), and batches copied.
  virtual double copy_ms() const = 0;
  virtual int64_t batches() const = 0;
};

}  // namespace cuda
}  // namespace feedline

#endif  // FEEDLINE_SRC_CUDA_DEVICE_H_
