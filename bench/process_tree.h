// feedline-bench: runs a helper program (the Python contenders of --compare-torch) and measures
// the memory of its whole process tree from the outside, while it runs.
//
// The memory of a tree of processes is sampled, not computed: every interval the tree is found
// again (/proc/*/stat parent links, so worker processes started later are seen) and the VmRSS
// of its members is summed; the figure is the peak of that sum. The sum counts pages that the
// processes share (the interpreter and libraries, pages inherited at fork) once per process,
// as `ps` and `top` do; the proportional set size (Pss, shared pages split between the
// processes that map them, shared-memory objects counted whole: TreePss) is read too, at the
// moments the sum reaches a new peak, since it costs milliseconds per process to read. Linux
// only.
//
// Thread safety: RunChild may be called from any thread; it starts one sampling thread.
#ifndef FEEDLINE_BENCH_PROCESS_TREE_H_
#define FEEDLINE_BENCH_PROCESS_TREE_H_

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace feedline::bench {

struct TreeMemory {
  int64_t peak_rss_sum_bytes = 0;  // the largest sum of VmRSS over the tree in one sample
  // The sum of Pss at the highest RSS-sum sample where it was read (it is read when the sum
  // reaches a new peak, at most twice a second).
  int64_t pss_near_peak_bytes = 0;
  int64_t max_hwm_bytes = 0;  // the largest VmHWM (its own exact peak) of one process
  int max_processes = 0;      // the most processes seen in the tree at once
  int samples = 0;
  // The figure to report: the peak of the sum, or one process's exact peak if larger (a
  // single-process tree's short peak can fall between two samples).
  int64_t peak_bytes() const {
    return peak_rss_sum_bytes > max_hwm_bytes ? peak_rss_sum_bytes : max_hwm_bytes;
  }
};

// The memory of the processes `pids`, in bytes: their proportional set sizes (a page mapped by k
// of them counts 1/k in each), with each shared-memory object counted whole, once, by the pages
// it holds, whether it is mapped or only held open (torch's DataLoader passes each batch from a
// worker as a shared-memory file that no process maps until the loop takes it, and a loop that
// reads part of a batch maps only that part: Pss alone misses the rest). Where an object cannot
// be measured (another user's process), its mapped share stands in.
int64_t TreePss(const std::vector<pid_t>& pids);

// Samples the memory of `root` and its descendants now into `memory` (peaks so far); reads
// Pss too if `read_pss` and the RSS sum is a new peak.
void SampleTreeMemory(pid_t root, bool read_pss, TreeMemory* memory);

struct ChildRun {
  int exit_code = 0;  // the child's exit status, or 128 + the signal that killed it
  std::vector<std::string> stdout_lines;
  TreeMemory memory;
  double seconds = 0;
};

// Runs `argv` (argv[0] an executable path) with `env` ("NAME=value" entries replacing or adding
// to this process's environment). The child's stdout is captured line by line, its stderr is
// ours. While it runs, its process tree's memory is sampled every `interval` (from a thread
// of this process, so the sampling costs the child nothing).
// Errors: the child could not be started (kNotFound, kPermissionDenied, ...).
absl::StatusOr<ChildRun> RunChild(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env,
                                  std::chrono::milliseconds interval);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_PROCESS_TREE_H_
