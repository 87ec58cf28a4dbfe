// feedline — a batch handed to the consumer.
//
// A batch is a view of one slot of the prefetch ring: images (uint8, NCHW or NHWC), labels
// (int64) and the epoch's sample indices. Copies of a `Batch` share the slot; the slot returns
// to the ring when the last copy is destroyed, so a batch stays valid for as long as the user
// holds it, and holding any number of batches never blocks the loader (the ring allocates a
// replacement slot; the held one is the user's memory until released).
//
// Thread safety: const methods may be called from any thread. The pixels may be written by the
// holder (the loader never touches a slot it has handed out).
#ifndef FEEDLINE_BATCH_H_
#define FEEDLINE_BATCH_H_

#include <array>
#include <cstdint>
#include <memory>

#include "feedline/options.h"

namespace feedline {

namespace internal {
struct BatchSlot;
struct DeviceBatch;
}  // namespace internal

class Batch {
 public:
  Batch() = default;

  // Number of samples (batch_size, or fewer for the last batch when drop_last is false).
  int64_t size() const noexcept { return size_; }
  // Position of this batch in its epoch (0-based) and the epoch it belongs to.
  int64_t index() const noexcept { return index_; }
  int64_t epoch() const noexcept { return epoch_; }
  Layout layout() const noexcept { return layout_; }
  DType dtype() const noexcept { return dtype_; }
  // -1: host memory; N: CUDA device N (images and labels are device pointers).
  int device() const noexcept { return device_; }
  int height() const noexcept { return height_; }
  int width() const noexcept { return width_; }

  // [size, 3, H, W] for NCHW, [size, H, W, 3] for NHWC.
  std::array<int64_t, 4> image_shape() const noexcept;
  int64_t image_bytes() const noexcept {
    return size_ * 3 * int64_t{height_} * width_ * ElementSize(dtype_);
  }

  // The image tensor's bytes (dtype() elements; uint8 by default). Device memory when
  // device() >= 0: then use it on a stream that waited for ready_event().
  const uint8_t* images() const noexcept;
  uint8_t* mutable_images() noexcept;
  const int64_t* labels() const noexcept;   // device memory when device() >= 0
  const int64_t* indices() const noexcept;  // the data set's sample index of each image (host)
  // device() >= 0: the cudaEvent_t recorded after the copy and conversion; a consumer stream
  // must wait on it (cudaStreamWaitEvent) before reading the batch.
  void* ready_event() const noexcept;
  // device() >= 0: tells the loader which stream uses the batch, so that its device buffer is
  // reused only after the work queued there so far (at release) is done. Default: the legacy
  // default stream.
  void set_consumer_stream(void* cuda_stream) const noexcept;

  // A handle that keeps the batch's memory alive (for zero-copy views such as DLPack).
  std::shared_ptr<const void> keep_alive() const noexcept {
    if (device_batch_) return device_batch_;
    return slot_;
  }

 private:
  friend class EpochRun;
  std::shared_ptr<internal::BatchSlot> slot_;
  std::shared_ptr<internal::DeviceBatch> device_batch_;  // device() >= 0
  int64_t size_ = 0;
  int64_t index_ = 0;
  int64_t epoch_ = 0;
  Layout layout_ = Layout::kNCHW;
  DType dtype_ = DType::kUint8;
  int device_ = -1;
  int height_ = 0;
  int width_ = 0;
};

}  // namespace feedline

#endif  // FEEDLINE_BATCH_H_
