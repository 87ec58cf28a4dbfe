#include "engine/replacement.h"

#include "feedline/random.h"

namespace feedline {

bool Replacement::MarkBad(int64_t sample) {
  std::lock_guard<std::mutex> lock(mu_);
  return bad_.insert(sample).second;
}

int64_t Replacement::Pick(int64_t seq, int64_t failed, int* attempt) {
  std::lock_guard<std::mutex> lock(mu_);
  bad_.insert(failed);
  // Draw k for position `seq` is fixed by (seed, epoch, seq, k), and the replacement is the
  // first good sample in that sequence: a draw already known bad is skipped, one not yet known
  // is read and found bad, and both move on to the next draw, so the choice does not depend on
  // which errors other workers found first (worker count, timing).
  while (*attempt < kAttempts) {
    ++*attempt;
    SampleRng rng(core_->shared->options.seed(), uint64_t(core_->epoch), uint64_t(seq),
                  kRngReplace + uint64_t(*attempt) * 0x10000);
    const int64_t r = core_->order[size_t(rng.Below(uint64_t(core_->total_seq)))];
    if (bad_.count(r) == 0) return r;
  }
  return -1;
}

}  // namespace feedline
