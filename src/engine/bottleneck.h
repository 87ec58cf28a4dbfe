// The one-line answer to "where is the bottleneck?", from a Stats snapshot's figures.
//
// The consumer limits when it rarely waits, or when it takes less than the workers could give;
// the copy when the GPU copy stream (H2D copy + conversion) is busy most of the time, so batches
// reach the device no faster than it copies them; storage when workers sit idle waiting for
// bytes while the readers are busy (slow reads); the map stage (the transform: decode,
// tokenize, a user's code) otherwise.
//
// Pure: a function of the figures only, so each verdict is unit-tested with made-up figures.
#ifndef FEEDLINE_SRC_ENGINE_BOTTLENECK_H_
#define FEEDLINE_SRC_ENGINE_BOTTLENECK_H_

#include "feedline/stats.h"

namespace feedline {

// Sets s->bottleneck and s->bottleneck_reason from s's elapsed time, batches, consumer wait,
// demand, workers, map and read figures, and its stages ("read", "map" and, with a GPU,
// "copy").
void DiagnoseBottleneck(Stats* s);

// The copy stream is the bottleneck when it is busy at least this fraction of the time.
inline constexpr double kCopyBusyLimit = 0.8;
// The consumer waited for a core more than this share of its CPU time: it is slowed.
inline constexpr double kSlowedConsumer = 0.10;

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_BOTTLENECK_H_
