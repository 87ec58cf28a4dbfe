// The GPU side of the pipeline: device discovery, pinned host memory for the ring, and the copy
// stage (H2D copies of every field on a dedicated non-blocking stream, per-field device hooks —
// the image field's uint8 -> normalised conversion kernel —, an event per batch, device buffers
// reused only after the consumer's work on them is done).
//
// Always compiled: without the CUDA toolkit (FEEDLINE_WITH_CUDA undefined) every entry point says
// that this build has no CUDA path; with it, the GPU is chosen at run time, and a machine without
// a GPU or driver gets kFailedPrecondition from `CheckDevice`, at once. CUDA calls select the
// loader's device for their duration and restore the caller's current device afterwards.
//
// Implements the device seam (feedline/device.h: ChooseDevice, DeviceStage) and includes nothing
// of the engine's internals or of the workloads: it copies what a HostBatch points to and makes
// the conversions a transform declared; the engine does not include this folder. Built into
// feedline::engine.
//
// Thread safety: `CopyStage::Submit` is called by one thread at a time (the consumer, or the
// worker that assembled the batch); a `DeviceBatch`'s release may happen on any thread (the
// DLPack deleter).
#ifndef FEEDLINE_SRC_CUDA_DEVICE_H_
#define FEEDLINE_SRC_CUDA_DEVICE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/host_allocator.h"
#include "feedline/device.h"

namespace feedline::cuda {

bool Compiled();

struct DeviceInfo {
  int index = 0;
  std::string name;
  int64_t memory_bytes = 0;
  int compute_capability = 0;  // major * 10 + minor
};
// The GPUs a driver reports (empty without CUDA, a driver or a GPU), and why there are none.
std::vector<DeviceInfo> Devices(std::string* why_none = nullptr);
// "cpu" -> -1; "cuda" -> the calling thread's current device (as torch's "cuda"; 0 when it
// cannot be asked); "cuda:N" -> N. kInvalidArgument for anything else.
absl::StatusOr<int> ParseDevice(const std::string& device);
// kFailedPrecondition when device `index` cannot be used (no CUDA build, driver or device).
absl::Status CheckDevice(int index);
// Page-locked host memory (cudaHostAlloc) for the ring's slots; null without CUDA.
HostAllocator* PinnedHostAllocator(int device);

// kInvalidArgument unless `spec` asks for conversions the copy stage makes: at most one, of a
// fixed uint8 field [size, size, 3]. (Device-independent: device_common.cc.)
absl::Status CheckConversions(const DeviceStageSpec& spec);

class CopyStage : public DeviceStage {
 public:
  // A stage for `device` copying batches of `spec`, with its conversions (at most one, of a
  // field that is uint8 [size, size, 3]: kInvalidArgument naming the field otherwise).
  static absl::StatusOr<std::unique_ptr<CopyStage>> Create(int device, DeviceStageSpec spec);
};

}  // namespace feedline::cuda

#endif  // FEEDLINE_SRC_CUDA_DEVICE_H_
