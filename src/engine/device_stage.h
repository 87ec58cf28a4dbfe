// The copy stage's seam: what the engine asks of a device. The engine names it; src/cuda/
// implements it (device_cuda.cc with the CUDA toolkit, device_none.cc without) in the same
// library, feedline::engine. The engine never includes src/cuda/; src/cuda/ includes this header
// and batch_slot.h, nothing else of the engine.
//
// Each batch handed out is submitted once — by the worker that assembled it when the consumer is
// near, else by the consumer thread — one submission at a time; the stage enqueues the copy
// of the slot's fields (and any per-field device work, such as the image conversion) on a
// stream of its own and returns at once with a `DeviceBatch` whose `ready_event` the consumer's
// stream waits on. The stage keeps the host slot until the copy from it is done, then lets it go
// back to the ring (the device batch keeps a copy of the slot's small host side: indices,
// shapes, lengths).
//
// Thread safety: `Submit` from one thread at a time (any thread); `DeviceBatch` release from
// any thread; the counters from any thread.
#ifndef FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_
#define FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "core/host_allocator.h"
#include "engine/batch_slot.h"
#include "feedline/options.h"
#include "feedline/schema.h"

namespace feedline {
namespace internal {

// A batch on a device.
struct DeviceBatch {
  virtual ~DeviceBatch() = default;
  struct Column {
    void* data = nullptr;  // device memory; null: the field stays on the host
    DType dtype = DType::kUint8;
    std::vector<int64_t> shape;
  };
  std::vector<Column> columns;  // one per field of the schema
  int device = 0;
  void* ready_event = nullptr;  // cudaEvent_t
  // The batch's host side, copied from its slot at submission: the slot itself goes back to
  // the ring as soon as the copy from it is done, whatever the batch's own life.
  std::shared_ptr<const SlotLayout> layout;
  std::vector<int64_t> indices;                // the data set index of each sample
  std::vector<internal::Column> host_columns;  // each field's shapes, lengths, offsets
  // Only when a field stays on the host (a column with null data): its slot, for the batch's
  // life.
  std::shared_ptr<BatchSlot> host;

  void CopyHostSide(const BatchSlot& slot, int64_t n) {
    layout = slot.layout_ref;
    indices.assign(slot.indices.begin(), slot.indices.begin() + n);
    host_columns = slot.columns;
  }
  // Makes `stream` (a cudaStream_t; null = the legacy default stream) wait for the batch, and
  // remembers it: the buffer is reused only after the work queued there at release is done.
  virtual absl::Status UseOnStream(void* stream) = 0;
};

}  // namespace internal

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  virtual int device() const = 0;
  // Enqueues the copy of the slot's first `n` samples (assembled); returns at once.
  virtual absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> Submit(
      std::shared_ptr<internal::BatchSlot> slot, int64_t n) = 0;
  // Device bytes this stage holds (its buffers).
  virtual int64_t device_bytes() const = 0;
  // Time the copies and kernels took, summed (ms), and batches copied.
  virtual double copy_ms() const = 0;
  virtual int64_t batches() const = 0;
  // Gives the slots whose copies are done back to the ring now (the stage also does it at each
  // Submit); the pool calls it before allocating a slot. `wait_ns` > 0: when no copy is done
  // yet, waits up to that long for the oldest one. Any thread.
  virtual void ReturnCopiedSlots(int64_t wait_ns) { (void)wait_ns; }
};

namespace internal {

// A conversion the device makes of one field after its copy, asked for by the workload that owns
// the field (the image built-in): the host slot holds uint8 HWC pixels, 3 channels, size x size;
// the device gets them as `dtype` in `layout`, normalised ((x / 255 - mean) / std) for floats.
struct PixelConversion {
  int field = 0;
  int size = 0;
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNCHW;
  std::array<double, 3> mean{}, std{};
};

// A loader's device: options.device() resolved.
struct DeviceChoice {
  int device = -1;                     // -1: the CPU; N: cuda:N
  HostAllocator* allocator = nullptr;  // the ring's memory (pinned for a GPU); null: the default
  // The copy stage for the slots' layout (null for the CPU).
  std::function<absl::StatusOr<std::unique_ptr<DeviceStage>>(std::shared_ptr<const SlotLayout>)>
      make_stage;
};

// Resolves "cpu", "cuda" or "cuda:N" (kInvalidArgument naming `device` otherwise); a GPU that
// cannot be used (no CUDA build, driver or device) fails at once with kFailedPrecondition and
// the reason. Defined in src/cuda/device_common.cc.
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& device,
                                          std::optional<PixelConversion> conversion);

}  // namespace internal
}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_DEVICE_STAGE_H_
