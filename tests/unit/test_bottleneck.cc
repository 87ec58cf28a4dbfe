// The bottleneck verdict from made-up figures: each of the four verdicts, and the figures behind
// it in the reason.
#include <catch2/catch.hpp>
#include <string>

#include "engine/bottleneck.h"
#include "feedline/stats.h"

using feedline::StageStats;
using feedline::Stats;

namespace {

// A 10 s run of 100 batches: `workers` map workers at 2 ms per sample.
Stats Run(double consumer_wait_fraction, double map_busy_s, double map_wait_s, double read_busy_s,
          double read_wait_s, int workers = 2) {
  Stats s;
  s.elapsed_s = 10;
  s.batches = 100;
  s.samples = 6400;
  s.consumer_wait_fraction = consumer_wait_fraction;
  s.consumer_wait_s = consumer_wait_fraction * s.elapsed_s;
  s.workers = workers;
  s.io_depth = 4;
  s.map_ms_per_sample = 2.0;
  s.read_ms = 20.0;
  s.stages.push_back(StageStats{"read", read_busy_s, read_wait_s, 6400, 4, -1});
  s.stages.push_back(StageStats{"map", map_busy_s, map_wait_s, 6400, workers, -1});
  s.stages.push_back(StageStats{"consumer", 9, 1, 100, 1, -1});
  return s;
}

bool Says(const Stats& s, const std::string& what) {
  return s.bottleneck_reason.find(what) != std::string::npos;
}

}  // namespace

TEST_CASE("bottleneck: no batch yet is unknown", "[bottleneck]") {
  Stats s;
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "unknown");
}

TEST_CASE("bottleneck: workers busy and the consumer waiting is the map stage", "[bottleneck]") {
  Stats s = Run(0.4, 19.5, 0.5, 2, 18);
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "map");
  REQUIRE(Says(s, "waited 40.0%"));
  REQUIRE(Says(s, "1000 samples/s at most"));  // 2 workers at 2 ms per sample
}

TEST_CASE("bottleneck: idle workers behind busy readers is storage", "[bottleneck]") {
  Stats s = Run(0.5, 6, 14, 38, 2);
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "storage");
  REQUIRE(Says(s, "idle 70%"));
  REQUIRE(Says(s, "20.0 ms each, 4 reads in flight"));
}

TEST_CASE("bottleneck: a consumer that rarely waits, or takes less than the map stage gives",
          "[bottleneck]") {
  Stats s = Run(0.01, 10, 10, 1, 19);
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "consumer");
  // Waiting 10%, but taking 400 samples/s of the 1000 the workers (half idle) could give.
  s = Run(0.10, 8, 12, 1, 19);
  s.demand_samples_per_s = 400;
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "consumer");
  REQUIRE(Says(s, "takes 400 samples/s"));
}

TEST_CASE("bottleneck: a GPU copy stream busy most of the time is copy", "[bottleneck]") {
  Stats s = Run(0.02, 10, 10, 1, 19);
  s.stages.push_back(StageStats{"copy", 8.5, 0, 100, 1, -1});  // 85 ms of 100 per batch
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "copy");
  REQUIRE(Says(s, "busy 85%"));
  REQUIRE(Says(s, "85.00 ms per batch"));
  // A copy stream busy half the time is not the limit.
  s.stages.back().busy_s = 5;
  feedline::DiagnoseBottleneck(&s);
  REQUIRE(s.bottleneck == "consumer");
}
