// Replacement of failed samples under on_error = skip: which sample takes a failed one's place.
//
// The replacement for position `seq` is drawn from (seed, epoch, seq, attempt), so a run with
// the same bad files is reproducible for any worker count; draws avoid samples already known
// bad in this epoch, and only reads count as attempts.
//
// Thread safety: all methods from any thread (one mutex, taken on failures only).
#ifndef FEEDLINE_SRC_ENGINE_REPLACEMENT_H_
#define FEEDLINE_SRC_ENGINE_REPLACEMENT_H_

#include <cstdint>
#include <mutex>
#include <set>

#include "absl/base/thread_annotations.h"
#include "engine/epoch_core.h"

namespace feedline {

class Replacement {
 public:
  static constexpr int kAttempts = 64;  // draws per position (a known-bad one costs no read)

  explicit Replacement(const EpochCore* core) : core_(core) {}
  // Records `sample` as bad in this epoch; true the first time (a file that fails twice in an
  // epoch, as a replacement too, is counted once).
  bool MarkBad(int64_t sample);
  // The sample to read instead of `failed` at position `seq`, or -1 when `*attempt` reached
  // kAttempts or no good sample was found. Increments `*attempt`.
  int64_t Pick(int64_t seq, int64_t failed, int* attempt);

 private:
  const EpochCore* const core_;
  std::mutex mu_;
  std::set<int64_t> bad_ ABSL_GUARDED_BY(mu_);
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_REPLACEMENT_H_
