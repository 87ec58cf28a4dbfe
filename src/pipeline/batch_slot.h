// Batch slots and the pool that recycles them (the prefetch ring's memory).
//
// A slot holds one batch: images written in place by the decoder workers, labels and indices.
// Slots are allocated once through a `HostAllocator` (the hook for pinned memory) and
// recycled: when the last `Batch` that references a slot dies, the slot goes back to the
// pool's free list. The slots the ring owns (in flight + cached) stay within `keep`, the ring
// depth: a returning slot beyond that is freed. Slots the user holds are the user's memory. A pool
// that is gone (loader destroyed) simply frees returning slots, so batches may outlive their
// loader.
//
// Thread safety: `SlotPool` is safe from any thread (a mutex guards the free list; it is taken
// once per batch, not per sample). A slot is written by decoder workers (disjoint samples)
// before it is handed out, and by nobody after.
#ifndef FEEDLINE_SRC_PIPELINE_BATCH_SLOT_H_
#define FEEDLINE_SRC_PIPELINE_BATCH_SLOT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"

namespace feedline {

// Allocates the big, long-lived buffers (ring slots). The default uses aligned malloc; the CUDA
// build swaps in pinned memory.
class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  virtual const char* name() const = 0;
};
HostAllocator* DefaultHostAllocator();

namespace internal {

struct BatchSlot {
  BatchSlot(HostAllocator* allocator, size_t image_bytes, int64_t batch_size);
  ~BatchSlot();
  BatchSlot(const BatchSlot&) = delete;
  BatchSlot& operator=(const BatchSlot&) = delete;

  HostAllocator* allocator;
  uint8_t* images;
  size_t image_bytes;
  std::vector<int64_t> labels;
  std::vector<int64_t> indices;
  bool in_ring = false;  // between Acquire() and MarkHandedOut(): owned by the loader
};

}  // namespace internal

class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  SlotPool(HostAllocator* allocator, size_t image_bytes, int64_t batch_size)
      : allocator_(allocator), image_bytes_(image_bytes), batch_size_(batch_size) {}
  ~SlotPool();

  // A free slot, or a new one. The returned pointer's deleter gives the slot back.
  std::shared_ptr<internal::BatchSlot> Acquire();
  // The slot leaves the ring for the consumer: its memory is the user's until released.
  void MarkHandedOut(internal::BatchSlot* slot);
  // How many slots the ring may own (in flight + cached free ones): the ring depth.
  void set_keep(int n);

  size_t slot_bytes() const { return image_bytes_ + 2 * sizeof(int64_t) * size_t(batch_size_); }
  int64_t allocated() const { return allocated_.load(std::memory_order_relaxed); }
  int64_t created() const { return created_.load(std::memory_order_relaxed); }
  int64_t cached() const;
  int64_t in_ring() const { return in_ring_.load(std::memory_order_relaxed); }

 private:
  void Return(internal::BatchSlot* slot);

  HostAllocator* const allocator_;
  const size_t image_bytes_;
  const int64_t batch_size_;
  std::atomic<int64_t> allocated_{0};  // alive now
  std::atomic<int64_t> created_{0};    // ever
  std::atomic<int64_t> in_ring_{0};
  mutable std::mutex mu_;
  std::vector<internal::BatchSlot*> free_ ABSL_GUARDED_BY(mu_);
  int keep_ ABSL_GUARDED_BY(mu_) = 4;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_PIPELINE_BATCH_SLOT_H_
