// Sleeping without spinning, for the threads of a pipeline that must not burn CPU while idle.
//
// libstdc++'s std::atomic::wait and std::counting_semaphore spin before they sleep (12 pause
// instructions, then 4 sched_yield calls, per wait). A decoder that waits for a read, or a reader
// that waits for its batch to be admitted, waits once per image or batch: in the consumer-bound
// regime that spinning was 12,000 sched_yield calls per 6,000 images (strace -c) and ~15% of
// the process's CPU. These two primitives go straight to the kernel's futex instead:
//   Semaphore  POSIX sem_t (glibc: an atomic fast path, futex sleep, no spinning);
//   WakeWord   a generation counter to sleep on until it changes (futex), with the wake-up
//              syscall skipped when nobody sleeps.
// Linux only (futex), as is the rest of the loader's I/O.
//
// Thread safety: all members may be called from any thread.
#ifndef FEEDLINE_SRC_PIPELINE_SLEEP_H_
#define FEEDLINE_SRC_PIPELINE_SLEEP_H_

#include <linux/futex.h>
#include <semaphore.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>

namespace feedline {

class Semaphore {
 public:
  explicit Semaphore(unsigned initial = 0) { sem_init(&sem_, /*pshared=*/0, initial); }
  ~Semaphore() { sem_destroy(&sem_); }
  Semaphore(const Semaphore&) = delete;
  Semaphore& operator=(const Semaphore&) = delete;

  void release() { sem_post(&sem_); }
  void acquire() {
    while (sem_wait(&sem_) != 0) {
      // EINTR (a signal handler ran): wait again.
    }
  }
  bool try_acquire() { return sem_trywait(&sem_) == 0; }

 private:
  sem_t sem_;
};

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

}  // namespace feedline

#endif  // FEEDLINE_SRC_PIPELINE_SLEEP_H_
