// The sampler and the transform geometry: pure functions, tested exhaustively.
#include <algorithm>
#include <limits>
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "engine/sampler.h"
#include "feedline/random.h"
#include "image/geometry.h"

using feedline::SamplerConfig;

TEST_CASE("every sample exactly once per epoch, order from (seed, epoch)", "[sampler]") {
  SamplerConfig c;
  c.dataset_size = 1003;
  c.batch_size = 10;
  c.seed = 7;
  for (int64_t epoch : {0, 1, 2}) {
    std::vector<int64_t> order = feedline::EpochOrder(c, epoch);
    REQUIRE(order.size() == 1003);
    std::vector<int64_t> sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 1003; ++i) REQUIRE(sorted[size_t(i)] == i);
    REQUIRE(feedline::EpochOrder(c, epoch) == order);  // reproducible
  }
  REQUIRE(feedline::EpochOrder(c, 0) != feedline::EpochOrder(c, 1));
  SamplerConfig other = c;
  other.seed = 8;
  REQUIRE(feedline::EpochOrder(other, 0) != feedline::EpochOrder(c, 0));
  REQUIRE(feedline::BatchesPerRank(c) == 101);
  c.drop_last = true;
  REQUIRE(feedline::BatchesPerRank(c) == 100);
  REQUIRE(feedline::EpochOrder(c, 0).size() == 1000);
  c.shuffle = false;
  c.drop_last = false;
  std::vector<int64_t> seq = feedline::EpochOrder(c, 3);
  for (int64_t i = 0; i < 1003; ++i) REQUIRE(seq[size_t(i)] == i);
}

TEST_CASE("batch and shard counts hold for any sizes, a state's included", "[sampler]") {
  // The counts, against their definitions, over every small case and at the int64 edges
  // (sizes a loaded state may carry: no sum in them may overflow).
  for (int64_t n = 0; n <= 12; ++n) {
    for (int w = 1; w <= 4; ++w) {
      for (int64_t b : {int64_t{1}, int64_t{3}, int64_t{5}}) {
        for (bool drop : {false, true}) {
          SamplerConfig c;
          c.dataset_size = n;
          c.world_size = w;
          c.batch_size = b;
          c.drop_last = drop;
          const int64_t per_rank = drop && n % w != 0 ? std::max<int64_t>(0, (n - w + w - 1) / w)
                                                      : (n + w - 1) / w;
          INFO("n " << n << " w " << w << " b " << b << " drop " << drop);
          REQUIRE(feedline::SamplesPerRank(c) == per_rank);
          REQUIRE(feedline::BatchesPerRank(c) == (drop ? per_rank / b : (per_rank + b - 1) / b));
        }
      }
    }
  }
  SamplerConfig huge;
  huge.dataset_size = 1003;
  huge.batch_size = std::numeric_limits<int64_t>::max();
  REQUIRE(feedline::BatchesPerRank(huge) == 1);
  huge.drop_last = true;
  REQUIRE(feedline::BatchesPerRank(huge) == 0);
  huge.dataset_size = std::numeric_limits<int64_t>::max();
  huge.batch_size = 2;
  huge.drop_last = false;
  REQUIRE(feedline::BatchesPerRank(huge) == std::numeric_limits<int64_t>::max() / 2 + 1);
}

TEST_CASE("ranks get disjoint, complete, equal shards (DistributedSampler)", "[sampler]") {
  for (int64_t n : {10, 11, 12, 97}) {
    for (int world : {1, 2, 3, 4}) {
      for (bool drop_last : {false, true}) {
        std::multiset<int64_t> all;
        std::set<size_t> sizes;
        std::set<int64_t> batches;
        for (int rank = 0; rank < world; ++rank) {
          SamplerConfig c;
          c.dataset_size = n;
          c.batch_size = 2;
          c.seed = 3;
          c.rank = rank;
          c.world_size = world;
          c.drop_last = drop_last;
          std::vector<int64_t> mine = feedline::EpochOrder(c, 5);
          sizes.insert(mine.size());
          batches.insert(feedline::BatchesPerRank(c));
          REQUIRE(int64_t(mine.size()) <= feedline::SamplesPerRank(c));
          all.insert(mine.begin(), mine.end());
        }
        INFO("n=" << n << " world=" << world << " drop_last=" << drop_last);
        REQUIRE(sizes.size() == 1);    // equal shards
        REQUIRE(batches.size() == 1);  // equal batch counts: no rank waits in a collective
        std::set<int64_t> distinct(all.begin(), all.end());
        if (!drop_last) {
          REQUIRE(int64_t(distinct.size()) == n);  // complete
          const int64_t padded = (n + world - 1) / world * world;
          REQUIRE(int64_t(all.size()) == padded);  // padding repeats only what is needed
        } else {
          REQUIRE(distinct.size() == all.size());  // disjoint
          REQUIRE(int64_t(all.size()) >= n - world * 2 - world);
        }
      }
    }
  }
}

TEST_CASE("even_shards = false: every sample exactly once over all ranks", "[sampler]") {
  for (int64_t n : {1, 10, 11, 97}) {
    for (int world : {1, 2, 3, 4}) {
      std::multiset<int64_t> all;
      std::set<size_t> sizes;
      for (int rank = 0; rank < world; ++rank) {
        SamplerConfig c;
        c.dataset_size = n;
        c.batch_size = 4;
        c.seed = 9;
        c.rank = rank;
        c.world_size = world;
        c.even_shards = false;
        const std::vector<int64_t> mine = feedline::EpochOrder(c, 2);
        REQUIRE(int64_t(mine.size()) == feedline::SamplesPerRank(c));
        sizes.insert(mine.size());
        all.insert(mine.begin(), mine.end());
      }
      INFO("n=" << n << " world=" << world);
      REQUIRE(int64_t(all.size()) == n);  // no padding duplicates
      REQUIRE(std::set<int64_t>(all.begin(), all.end()).size() == size_t(n));
      REQUIRE(*sizes.rbegin() - *sizes.begin() <= 1);
    }
  }
}

TEST_CASE("SampleRng: uniform and unbiased enough", "[sampler]") {
  feedline::SampleRng rng(1, 2, 3, 4);
  std::map<uint64_t, int> counts;
  double sum = 0;
  const int n = 60000;
  for (int i = 0; i < n; ++i) {
    counts[rng.Below(6)]++;
    sum += rng.Uniform();
  }
  REQUIRE(counts.size() == 6);
  for (auto& [k, v] : counts) REQUIRE(std::abs(v - n / 6) < 600);  // ~5 sigma
  REQUIRE(std::abs(sum / n - 0.5) < 0.01);
  // Keyed streams differ.
  REQUIRE(feedline::SampleRng(1, 2, 3, 4).Next() != feedline::SampleRng(1, 2, 4, 4).Next());
}

TEST_CASE("RandomResizedCrop box follows torchvision's sampling", "[transform]") {
  const int W = 500, H = 375;
  double area_sum = 0, log_ratio_sum = 0;
  const int n = 20000;
  int fallbacks = 0;
  for (int i = 0; i < n; ++i) {
    feedline::SampleRng rng(0, 0, uint64_t(i), feedline::kRngCrop);
    feedline::CropBox b =
        feedline::RandomResizedCropBox(W, H, {0.08, 1.0}, {3.0 / 4, 4.0 / 3}, rng);
    REQUIRE(b.width >= 1);
    REQUIRE(b.height >= 1);
    REQUIRE(b.left >= 0);
    REQUIRE(b.top >= 0);
    REQUIRE(b.left + b.width <= W);
    REQUIRE(b.top + b.height <= H);
    if (b.width == W && b.height == H) ++fallbacks;
    area_sum += double(b.width) * b.height / (double(W) * H);
    log_ratio_sum += std::log(double(b.width) / b.height);
  }
  // Accepted draws are uniform in area fraction over [0.08, 1] truncated by the fit test
  // (large boxes with extreme ratios are rejected), so the mean area is a bit below 0.54.
  const double mean_area = area_sum / n;
  REQUIRE(mean_area > 0.40);
  REQUIRE(mean_area < 0.54);
  REQUIRE(std::abs(log_ratio_sum / n) < 0.05);  // log-uniform ratio, symmetric
  REQUIRE(fallbacks < n / 50);
}

TEST_CASE("RandomResizedCrop falls back to torchvision's central crop", "[transform]") {
  feedline::SampleRng rng(0, 0, 0, feedline::kRngCrop);
  // Too wide for any allowed ratio at this scale: 10 attempts fail.
  feedline::CropBox b = feedline::RandomResizedCropBox(1000, 10, {0.99, 1.0}, {0.75, 4.0 / 3}, rng);
  REQUIRE(b.height == 10);
  REQUIRE(b.width == 13);  // round(10 * 4/3)
  REQUIRE(b.top == 0);
  REQUIRE(b.left == (1000 - 13) / 2);
  // Too tall: w = width, h = round(w / min_ratio).
  b = feedline::RandomResizedCropBox(10, 1000, {0.99, 1.0}, {0.75, 4.0 / 3}, rng);
  REQUIRE(b.width == 10);
  REQUIRE(b.height == 13);  // round(10 / 0.75) = round(13.33)
  REQUIRE(b.top == (1000 - 13) / 2);
}

TEST_CASE("eval geometry is torchvision's Resize + CenterCrop", "[transform]") {
  feedline::EvalGeometry g = feedline::ComputeEvalGeometry(500, 375, 256, 224);
  REQUIRE(g.resized_w == 341);  // int(256 * 500 / 375)
  REQUIRE(g.resized_h == 256);
  REQUIRE(g.crop_top == 16);
  REQUIRE(g.crop_left == 58);  // round(58.5) = 58: Python rounds half to even
  g = feedline::ComputeEvalGeometry(375, 500, 256, 224);
  REQUIRE(g.resized_w == 256);
  REQUIRE(g.resized_h == 341);
  g = feedline::ComputeEvalGeometry(300, 300, 256, 224);
  REQUIRE(g.resized_w == 256);
  REQUIRE(g.crop_left == 16);
  g = feedline::ComputeEvalGeometry(1, 1000, 256, 224);  // extreme: 1 px wide
  REQUIRE(g.resized_w == 256);
  REQUIRE(g.resized_h == 256000);
  // A crop larger than the resized side: torchvision pads (crop - side) // 2 before, rounding
  // down, where round((side - crop) / 2) would give -6 for 53 -> 64.
  g = feedline::ComputeEvalGeometry(2000, 1500, 40, 64);
  REQUIRE(g.resized_w == 53);
  REQUIRE(g.resized_h == 40);
  REQUIRE(g.crop_left == -5);
  REQUIRE(g.crop_top == -12);
  g = feedline::ComputeEvalGeometry(1500, 2000, 40, 64);
  REQUIRE(g.crop_left == -12);
  REQUIRE(g.crop_top == -5);
}
