#include "engine/sampler.h"

#include <algorithm>
#include <cstddef>
#include <numeric>
#include <utility>

#include "feedline/random.h"

namespace feedline {

int64_t SamplesPerRank(const SamplerConfig& c) {
  const int64_t n = c.dataset_size, w = c.world_size;
  // Ceilings written so that no sum can overflow (sizes may come from a state someone handed in).
  auto ceil_div = [](int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); };
  if (!c.even_shards) return n > c.rank ? ceil_div(n - c.rank, w) : 0;
  if (c.drop_last && n % w != 0) return (n - 1) / w;  // ceil((n - w) / w), n >= 1 here
  return ceil_div(n, w);
}

int64_t BatchesPerRank(const SamplerConfig& c) {
  const int64_t s = SamplesPerRank(c);
  return c.drop_last ? s / c.batch_size : s / c.batch_size + (s % c.batch_size != 0 ? 1 : 0);
}

SamplerConfig AfterSkip(SamplerConfig c, int64_t skip) {
  c.dataset_size -= std::clamp<int64_t>(skip, 0, c.dataset_size);
  return c;
}

std::vector<int64_t> EpochOrder(const SamplerConfig& full, int64_t epoch, int64_t skip) {
  const int64_t n = full.dataset_size;
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  if (full.shuffle) {
    SampleRng rng(full.seed, static_cast<uint64_t>(epoch), 0, kRngShuffle);
    for (int64_t i = n - 1; i > 0; --i) {
      std::swap(perm[size_t(i)], perm[size_t(rng.Below(uint64_t(i) + 1))]);
    }
  }
  // The positions still to deliver: [skip, n) (all of them but for a resumed epoch).
  skip = std::clamp<int64_t>(skip, 0, n);
  if (skip > 0) perm.erase(perm.begin(), perm.begin() + skip);
  const SamplerConfig c = AfterSkip(full, skip);
  const int64_t left = c.dataset_size;
  const int64_t per_rank = SamplesPerRank(c);
  const int64_t total = per_rank * c.world_size;
  std::vector<int64_t> mine;
  mine.reserve(size_t(per_rank));
  for (int64_t pos = c.rank; int64_t(mine.size()) < per_rank && pos < total; pos += c.world_size) {
    mine.push_back(perm[size_t(pos % left)]);  // pos >= left: padding repeats from the start
  }
  if (c.drop_last) mine.resize(size_t(mine.size() / size_t(c.batch_size) * size_t(c.batch_size)));
  return mine;
}

}  // namespace feedline
