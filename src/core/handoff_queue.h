// The hand-off between stages: oneTBB's lock-free concurrent_queue for the items, and a
// counting semaphore (a futex) for the sleep when it is empty.
//
// Why not tbb::concurrent_bounded_queue, which blocks by itself: its pop spins with
// sched_yield before it sleeps. Measured here (feedline-bench --tune-grid, a slow consumer),
// idle decoders spinning that way cost 1.5x the CPU per image of an idle-sleeping pipeline,
// which is exactly the CPU the consumer-bound regime must not burn.
//
// `Semaphore` (core/sleep.h): SpinningSemaphore (spins, then sleeps: for the stage hand-offs,
// where few threads wait and the spin gives the core to the producer) or SleepingSemaphore (for
// queues where many threads may wait at once). Both skip the wake-up system call when nobody
// sleeps.
//
// Unbounded: the number of items in circulation (read buffers) bounds it. A null item is the
// stop sentinel, pushed once per consumer thread.
//
// Thread safety: any number of producers and consumers.
#ifndef FEEDLINE_SRC_CORE_HANDOFF_QUEUE_H_
#define FEEDLINE_SRC_CORE_HANDOFF_QUEUE_H_

#include <oneapi/tbb/concurrent_queue.h>

#include <cstddef>
#include <memory>

#include "core/sleep.h"

namespace feedline {

template <typename T, typename Semaphore = SpinningSemaphore>
class HandoffQueue {
 public:
  void push(T item) {
    items_.push(item);
    available_.release();
  }
  // Blocks until an item is there.
  void pop(T& item) {
    available_.acquire();
    // The release that let us through was made after its push, so an item is there.
    while (!items_.try_pop(item)) {
    }
  }
  bool try_pop(T& item) {
    if (!available_.try_acquire()) return false;
    while (!items_.try_pop(item)) {
    }
    return true;
  }
  std::ptrdiff_t size() const { return std::ptrdiff_t(items_.unsafe_size()); }

 private:
#if defined(__SANITIZE_THREAD__)
  // Under ThreadSanitizer the queue's pages come from malloc, which it sees: pages from
  // oneTBB's own (uninstrumented) allocator, reused at the address another thread last read,
  // were reported as races (a CI-like run: push's new page vs the previous pop's last read).
  tbb::concurrent_queue<T, std::allocator<T>> items_;
#else
  tbb::concurrent_queue<T> items_;
#endif
  Semaphore available_{0};
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_HANDOFF_QUEUE_H_
