// The sampler: which sample indices this rank reads in an epoch, in which order.
//
// Order = a permutation from (seed, epoch) when shuffling, else 0..n-1; then
// DistributedSampler's split: padded by repeating from the start (drop_last = false) or
// truncated (drop_last = true) to a multiple of world_size, and rank r takes positions
// r, r + world_size, ... — every rank gets the same number of samples, hence of batches.
// Without `even_shards` (distributed evaluation: every sample exactly once over all ranks) the
// order is neither padded nor truncated: rank r takes r, r + world_size, ... < dataset size,
// and ranks differ by at most one sample.
#ifndef FEEDLINE_SRC_ENGINE_SAMPLER_H_
#define FEEDLINE_SRC_ENGINE_SAMPLER_H_

#include <cstdint>
#include <vector>

namespace feedline {

struct SamplerConfig {
  int64_t dataset_size = 0;
  int64_t batch_size = 1;
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  int rank = 0;
  int world_size = 1;
  bool even_shards = true;
};

// Samples per epoch for one rank (padding included).
int64_t SamplesPerRank(const SamplerConfig& c);
// Batches per epoch for one rank.
int64_t BatchesPerRank(const SamplerConfig& c);
// The rank's sample indices for `epoch`, truncated to whole batches when drop_last.
//
// `skip` > 0: the epoch resumed on another layout (world size or batch size) after the first
// `skip` positions of its order were delivered by the ranks of the old one (they took position
// p on rank p % world_size, batch by batch, so what they delivered is always a prefix of the
// order). The rest of the order, positions [skip, n), is split over this layout's ranks as a
// whole epoch of n - skip samples would be (padding or truncation included): every sample no
// rank had delivered comes once more, none that was delivered comes again.
std::vector<int64_t> EpochOrder(const SamplerConfig& c, int64_t epoch, int64_t skip = 0);
// The layout of such a resumed epoch: `c` over its n - skip remaining samples.
SamplerConfig AfterSkip(SamplerConfig c, int64_t skip);

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_SAMPLER_H_
