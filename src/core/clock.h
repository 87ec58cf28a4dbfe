// Clocks for stage accounting: a monotonic wall clock and the calling thread's CPU time.
//
// Thread safety: pure functions; call them from any thread.
#ifndef FEEDLINE_SRC_CORE_CLOCK_H_
#define FEEDLINE_SRC_CORE_CLOCK_H_

#include <time.h>

#include <chrono>
#include <cstdint>

namespace feedline {

// CPU time of the calling thread (clock_gettime: ~100 ns, once per sample).
inline int64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// The calling thread's scheduler figures since it started: CPU time and the time it was ready
// to run but waited for a core (/proc/thread-self/schedstat; ~5 us). False where the kernel
// does not keep them (then both are left as they are).
bool ThreadSchedStat(int64_t* cpu_ns, int64_t* run_delay_ns);

inline int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_CLOCK_H_
