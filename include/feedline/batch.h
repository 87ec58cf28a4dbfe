// feedline — a batch handed to the consumer.
//
// A batch is a view of one slot of the prefetch ring: one column per field of the loader's
// schema (see schema.h), plus the data set index of each sample. Copies of a `Batch` share the
// slot; the slot returns to the ring when the last copy is destroyed, so a batch stays valid for
// as long as the user holds it, and holding any number of batches never blocks the loader (the
// ring allocates a replacement slot; the held one is the user's memory until released).
//
//   for (absl::StatusOr<feedline::Batch>& batch : *loader) {
//     feedline::TensorView tokens = batch->field("tokens");   // int32 [B, longest]
//     const int64_t* lengths = tokens.lengths;                 // each sample's length
//   }
//
// The image built-in's fields are "image" and "label"; `images()`, `labels()`, `image_shape()`
// and `dtype()` are shorthands for them.
//
// Thread safety: const methods may be called from any thread. The memory may be written by the
// holder (the loader never touches a slot it has handed out).
#ifndef FEEDLINE_BATCH_H_
#define FEEDLINE_BATCH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "feedline/schema.h"
#include "feedline/transform.h"

namespace feedline {

namespace internal {
struct BatchSlot;
struct DeviceBatch;
}  // namespace internal
class SlotPool;

// One field of a batch: a dense tensor (fixed shapes, or variable ones padded to the batch's
// longest) or a ragged one (values back to back, with offsets).
struct TensorView {
  void* data = nullptr;  // device memory when device >= 0; null when the batch has no such field
  DType dtype = DType::kUint8;
  std::vector<int64_t> shape;  // [B, ...]; ragged: [total elements]
  int device = -1;             // -1: host memory; N: CUDA device N
  // Variable fields only (host memory, B entries): each sample's own size in its first variable
  // dimension (the "lengths" of a padded sequence batch)...
  const int64_t* lengths = nullptr;
  // ... each sample's whole shape ([B * rank], row per sample)...
  const int64_t* sample_shapes = nullptr;
  // ... and, ragged only, where each sample's elements start ([B + 1], in elements).
  const int64_t* offsets = nullptr;

  bool ragged() const noexcept { return offsets != nullptr; }
  int64_t elements() const noexcept {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  int64_t bytes() const noexcept { return elements() * ElementSize(dtype); }
};

// Batch::set_consumer_stream: "the consumer synchronises itself" (DLPack's stream -1).
inline void* const kNoSyncStream = reinterpret_cast<void*>(intptr_t{-1});

class Batch {
 public:
  Batch() = default;

  // Number of samples (batch_size, or fewer for the last batch when drop_last is false).
  int64_t size() const noexcept { return size_; }
  // Position of this batch in its epoch (0-based) and the epoch it belongs to.
  int64_t index() const noexcept { return index_; }
  int64_t epoch() const noexcept { return epoch_; }
  // -1: host memory; N: the fields the copy stage moved are on CUDA device N.
  int device() const noexcept { return device_; }

  // The loader's schema (the empty schema for a default-constructed batch).
  const Schema& schema() const noexcept;
  int num_fields() const noexcept { return schema().size(); }
  TensorView field(int i) const;
  // The field called `name`; a view with null data when there is none.
  TensorView field(std::string_view name) const;
  // The data set's sample index of each sample (host memory, size() entries).
  const int64_t* indices() const noexcept;

  // Image built-in shorthands: the "image" field ([B, 3, H, W] or [B, H, W, 3]; uint8 unless a
  // float dtype was asked), and the "label" field (int64 [B]).
  std::array<int64_t, 4> image_shape() const;
  DType dtype() const { return field("image").dtype; }
  int64_t image_bytes() const { return field("image").bytes(); }
  const uint8_t* images() const { return static_cast<const uint8_t*>(field("image").data); }
  uint8_t* mutable_images() { return static_cast<uint8_t*>(field("image").data); }
  const int64_t* labels() const { return static_cast<const int64_t*>(field("label").data); }

  // device() >= 0: the cudaEvent_t recorded after the copy (and conversion); a consumer stream
  // must wait on it (cudaStreamWaitEvent) before reading the batch.
  void* ready_event() const noexcept;
  // device() >= 0: makes `cuda_stream` wait for the batch and remembers it, so that the batch's
  // device buffer is reused only after the work queued there so far (at release) is done.
  // Null or cudaStreamLegacy: the legacy default stream; cudaStreamPerThread: the calling
  // thread's (the release is then ordered on the legacy stream, which waits for it);
  // kNoSyncStream: no wait, the consumer synchronises itself (the buffer is reused only after a
  // device-wide synchronisation at release). An error when the CUDA calls fail (then do not
  // use the batch on that stream); it carries kDeviceErrorPayload (error.h).
  absl::Status set_consumer_stream(void* cuda_stream) const;

  // A handle that keeps the batch's memory alive (for zero-copy views such as DLPack).
  std::shared_ptr<const void> keep_alive() const noexcept {
    if (device_batch_) return device_batch_;
    return slot_;
  }

 private:
  friend class EpochRun;
  friend class BatchBuilder;
  std::shared_ptr<internal::BatchSlot> slot_;
  std::shared_ptr<internal::DeviceBatch> device_batch_;  // device() >= 0
  int64_t size_ = 0;
  int64_t index_ = 0;
  int64_t epoch_ = 0;
  int device_ = -1;
};

// Host batches of a schema made outside a loader's ring, by a stage that builds its own rows
// from a loader's batches (the text packer, feedline/text.h): the same columns, padding, ragged
// offsets and lifetime as a loader's batches. Slots are recycled when the batches are released.
//
//   auto builder = feedline::BatchBuilder::Create(schema, /*batch_size=*/8);
//   for (int64_t row = 0; row < n; ++row) {
//     feedline::SampleWriter& w = (*builder)->Writer(row);
//     ... w.Fixed<int64_t>(0) ..., (*builder)->indices()[row] = ...;
//   }
//   absl::StatusOr<feedline::Batch> batch = (*builder)->Finish(n, batch_index, epoch);
//
// Thread safety: one thread builds; the batches it finishes are as a loader's.
class BatchBuilder {
 public:
  // kInvalidArgument for an invalid schema or a batch_size < 1.
  static absl::StatusOr<std::unique_ptr<BatchBuilder>> Create(Schema schema, int64_t batch_size);
  ~BatchBuilder();
  BatchBuilder(const BatchBuilder&) = delete;
  BatchBuilder& operator=(const BatchBuilder&) = delete;

  const Schema& schema() const noexcept;
  int64_t batch_size() const noexcept;
  // The writer of sample `pos` (< batch_size) of the batch being built, fresh at each call (a
  // slot is taken at the first call after Finish). Valid until the next call for `pos`.
  SampleWriter& Writer(int64_t pos);
  // The batch's sample indices (batch_size entries), for the builder to fill.
  int64_t* indices();
  // The first `n` samples as a batch (variable fields padded or made ragged as in a loader).
  // kInvalidArgument when a sample below `n` left a field unwritten (naming it) or n is out of
  // [1, batch_size]; the slot is then reused for the next batch.
  absl::StatusOr<Batch> Finish(int64_t n, int64_t index, int64_t epoch);

 private:
  struct Impl;
  explicit BatchBuilder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace feedline

#endif  // FEEDLINE_BATCH_H_
