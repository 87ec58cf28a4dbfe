#include "core/clock.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

namespace feedline {

bool ThreadSchedStat(int64_t* cpu_ns, int64_t* run_delay_ns) {
  // "<ns on a CPU> <ns waiting on a run queue> <time slices>\n"
  const int fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[96];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = '\0';
  char* end = nullptr;
  const long long cpu = std::strtoll(buf, &end, 10);
  if (end == buf) return false;
  char* end2 = nullptr;
  const long long delay = std::strtoll(end, &end2, 10);
  if (end2 == end || cpu < 0 || delay < 0) return false;
  *cpu_ns = cpu;
  *run_delay_ns = delay;
  return true;
}

}  // namespace feedline
