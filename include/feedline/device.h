// feedline — the device seam: what the engine asks of a device, in public types only.
//
// The engine hands each assembled batch to a `DeviceStage` as a `HostBatch` (one pointer and
// shape per field, and an owner of the host memory) and gets back a `DeviceCopy` (the fields on
// the device, and an event to wait on). A field the device should convert after its copy is
// declared by the workload that owns it, through its transform
// (`SampleTransform::DeviceConversions`): the image built-in declares uint8 HWC pixels ->
// normalised float / half / bfloat16 in the layout asked for. The stage is made for one schema
// and batch size (`DeviceStageSpec`).
//
// src/cuda implements this seam (with the CUDA toolkit a stage on a non-blocking stream of its
// own; without it every device but the CPU is refused) and includes nothing of the engine's
// internals or of the workloads; the engine calls `ChooseDevice` and never includes src/cuda.
//
// Thread safety: `Submit` from one thread at a time (any thread); a `DeviceCopy`'s release from
// any thread; the counters from any thread.
#ifndef FEEDLINE_DEVICE_H_
#define FEEDLINE_DEVICE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "feedline/options.h"
#include "feedline/schema.h"

namespace feedline {

class HostAllocator;

// A conversion the device makes of one field after its copy, declared by the workload that
// owns the field: the host field holds uint8 pixels [size, size, 3] (HWC); the device gets them
// as `dtype` in `layout`, normalised ((x / 255 - mean) / std) when `dtype` is a float type.
struct DeviceConversion {
  int field = 0;
  int size = 0;
  DType dtype = DType::kUint8;
  Layout layout = Layout::kNCHW;
  std::array<double, 3> mean{}, std{};
};

// What a stage is made for: the loader's schema, its batch size, the most bytes each field of
// one batch holds on the host (the device buffers' sizes), and the workload's conversions.
struct DeviceStageSpec {
  Schema schema;
  int64_t batch_size = 0;
  std::vector<int64_t> field_bytes;  // one per field of the schema
  std::vector<DeviceConversion> conversions;
};

// One assembled batch on the host, as the stage copies it.
struct HostBatch {
  struct Field {
    const void* data = nullptr;  // the column, as the batch holds it (dtype: the schema's)
    std::vector<int64_t> shape;  // padded/fixed: [n, ...]; ragged: [total elements]
  };
  int64_t size = 0;                  // samples
  const int64_t* indices = nullptr;  // the data set index of each sample
  std::vector<Field> fields;         // one per field of the schema
  // Owns the memory above: the stage keeps it until its copy from it is done, then drops it
  // (the engine's slot goes back to the ring then, whatever the device batch's own life).
  std::shared_ptr<const void> owner;
};

// A batch's fields on a device, until the last reference to it is dropped.
struct DeviceCopy {
  virtual ~DeviceCopy() = default;
  struct Column {
    void* data = nullptr;  // device memory; null: the field stays on the host
    DType dtype = DType::kUint8;
    std::vector<int64_t> shape;
  };
  std::vector<Column> columns;  // one per field of the schema
  int device = 0;
  void* ready_event = nullptr;  // cudaEvent_t: the copy (and conversions) are done
  // Makes `stream` (a cudaStream_t; null = the legacy default stream) wait for the batch, and
  // remembers it: the buffer is reused only after the work queued there at release is done.
  virtual absl::Status UseOnStream(void* stream) = 0;
};

class DeviceStage {
 public:
  virtual ~DeviceStage() = default;
  virtual int device() const = 0;
  // Enqueues the copy of `batch` (and the conversions); returns at once.
  virtual absl::StatusOr<std::shared_ptr<DeviceCopy>> Submit(HostBatch batch) = 0;
  // Device bytes this stage holds (its buffers).
  virtual int64_t device_bytes() const = 0;
  // Time the copies and conversions took, summed (ms), and batches copied.
  virtual double copy_ms() const = 0;
  virtual int64_t batches() const = 0;
  // Drops the owners of the batches whose copies are done now (the stage also does it at each
  // Submit); the engine calls it before allocating a slot. `wait_ns` > 0: when no copy is done
  // yet, waits up to that long for the oldest one. Any thread.
  virtual void ReturnCopied(int64_t wait_ns) { (void)wait_ns; }
};

// A loader's device: options.device() resolved.
struct DeviceChoice {
  int device = -1;                     // -1: the CPU; N: cuda:N
  HostAllocator* allocator = nullptr;  // host memory for the ring (pinned for a GPU); null: any
  // The copy stage (a GPU only).
  std::function<absl::StatusOr<std::unique_ptr<DeviceStage>>(DeviceStageSpec)> make_stage;
};

// Resolves "cpu", "cuda" or "cuda:N" (kInvalidArgument naming `device` otherwise); a GPU that
// cannot be used (no CUDA build, driver or device) fails at once with kFailedPrecondition and the
// reason.
absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& device);

}  // namespace feedline

#endif  // FEEDLINE_DEVICE_H_
