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
  if (*attempt >= kAttempts) return -1;
  ++*attempt;
  // Draws that hit a sample already known bad are free: only reads count as attempts.
  SampleRng rng(core_->shared->options.seed(), uint64_t(core_->epoch), uint64_t(seq),
                kRngReplace + uint64_t(*attempt) * 0x10000);
  for (int draw = 0; draw < 256; ++draw) {
    const int64_t r = core_->order[size_t(rng.Below(uint64_t(core_->total_seq)))];
    if (bad_.count(r) == 0) return r;
  }
  return -1;
}

}  // namespace feedline
