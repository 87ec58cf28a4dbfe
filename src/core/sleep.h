// Sleeping without spinning, for threads parked until something changes.
//
// libstdc++'s std::atomic::wait spins before it sleeps (12 pause instructions, then 4
// sched_yield calls, per wait). Readers parked until their batch is admitted are woken by every
// consumed batch (notify_all), and there are io_depth of them: tens with slow storage, each
// spinning through its yields for nothing on every batch. WakeWord goes straight to the
// kernel's futex instead, and skips the wake-up syscall when nobody sleeps.
//
// (The stage hand-off, HandoffQueue, spins before it sleeps (SpinningSemaphore): there the
// yields pay off, because on few cores they give the CPU to the thread about to produce.
// Measured with `feedline-bench --source synthetic`: 178-225k samples/s with a spin, 92-108k
// with a sem_t that sleeps at once; no difference in the consumer-bound regime.)
//
// Linux only (futex), as is the rest of the loader's I/O.
//
// Thread safety: all members may be called from any thread.
#ifndef FEEDLINE_SRC_CORE_SLEEP_H_
#define FEEDLINE_SRC_CORE_SLEEP_H_

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdint>

namespace feedline {

class WakeWord {
 public:
  // The current generation; pass it to Wait after checking the condition waited for.
  uint32_t Load() const { return gen_.load(std::memory_order_acquire); }

  // Sleeps until the generation is no longer `seen` (it may also return early, spuriously).
  void Wait(uint32_t seen) {
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    if (gen_.load(std::memory_order_seq_cst) == seen) {
      syscall(SYS_futex, Address(), FUTEX_WAIT_PRIVATE, seen, nullptr, nullptr, 0);
    }
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

  // A new generation; wakes every sleeper.
  void WakeAll() {
    gen_.fetch_add(1, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      syscall(SYS_futex, Address(), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    }
  }

 private:
  static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
                std::atomic<uint32_t>::is_always_lock_free);
  uint32_t* Address() { return reinterpret_cast<uint32_t*>(&gen_); }

  std::atomic<uint32_t> gen_{0};
  std::atomic<int> sleepers_{0};
};

// A spin-wait hint to the CPU (x86 PAUSE, Arm YIELD).
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__) || defined(__arm__)
  asm volatile("yield" ::: "memory");
#endif
}

// A counting semaphore on a futex whose release makes no system call when nobody sleeps.
// (libstdc++ 12's std::counting_semaphore wakes the futex on every release from zero, sleeper
// or not: for a worker that keeps up with its reader, that is a system call per hand-off.)
//
// kSpins = 0: sleeps at once, for waits where many threads may wait together and spinning
// helps nobody: readers waiting for a free read item when storage is slow (tens of them;
// std::counting_semaphore's spin and sched_yield calls per wait cost ~5% of the CPU of a
// remote run at io_depth 90, measured with perf).
// kSpins > 0: first tries that many times, pausing for the first 3/4 and yielding the core for
// the rest (as libstdc++ does), for the stage hand-offs where few threads wait and the yield
// gives the core to the thread about to produce.
template <int kSpins>
class FutexSemaphore {
 public:
  explicit FutexSemaphore(int32_t initial = 0) : count_(initial) {}
  void release() {
    count_.fetch_add(1, std::memory_order_seq_cst);
    if (waiters_.load(std::memory_order_seq_cst) > 0) {
      syscall(SYS_futex, Address(), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
    }
  }
  bool try_acquire() {
    int32_t c = count_.load(std::memory_order_relaxed);
    while (c > 0) {
      if (count_.compare_exchange_weak(c, c - 1, std::memory_order_acquire,
                                       std::memory_order_relaxed)) {
        return true;
      }
    }
    return false;
  }
  void acquire() {
    for (int i = 0; i < kSpins; ++i) {
      if (try_acquire()) return;
      if (i < kSpins * 3 / 4) {
        CpuRelax();
      } else {
        sched_yield();
      }
    }
    while (!try_acquire()) {
      // A release after the increment below sees the waiter and wakes one; one before it
      // made the count non-zero, and the futex does not sleep on a changed count.
      waiters_.fetch_add(1, std::memory_order_seq_cst);
      if (count_.load(std::memory_order_seq_cst) == 0) {
        syscall(SYS_futex, Address(), FUTEX_WAIT_PRIVATE, 0, nullptr, nullptr, 0);
      }
      waiters_.fetch_sub(1, std::memory_order_relaxed);
    }
  }

 private:
  static_assert(sizeof(std::atomic<int32_t>) == sizeof(int32_t) &&
                std::atomic<int32_t>::is_always_lock_free);
  int32_t* Address() { return reinterpret_cast<int32_t*>(&count_); }

  std::atomic<int32_t> count_{0};
  std::atomic<int> waiters_{0};
};

using SleepingSemaphore = FutexSemaphore<0>;
using SpinningSemaphore = FutexSemaphore<16>;

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_SLEEP_H_
