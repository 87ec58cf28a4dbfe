// The process's fork generation: bumped in the child after every fork(). Threads (and the
// objects waiting on them) made before a fork do not exist in the child: an object that
// records the generation it started threads in can tell it is a forked copy.
//
// Thread safety: any thread.
#ifndef FEEDLINE_SRC_CORE_FORK_GENERATION_H_
#define FEEDLINE_SRC_CORE_FORK_GENERATION_H_

#include <pthread.h>

#include <atomic>
#include <cstdint>

namespace feedline {

namespace internal {
inline std::atomic<uint64_t> g_fork_generation{0};
inline void OnForkChild() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
}  // namespace internal

inline uint64_t ForkGeneration() {
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr, &internal::OnForkChild) == 0;
  }();
  (void)registered;
  return internal::g_fork_generation.load(std::memory_order_relaxed);
}

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_FORK_GENERATION_H_
