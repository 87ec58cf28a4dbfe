// The whole CPU pipeline with real files and real threads, at several concurrency levels.
// Also built and run under ThreadSanitizer by .ci/run.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <thread>

#include "engine/batch_slot.h"
#include "feedline/feedline.h"
#include "test_util.h"

namespace t = feedline::testing;
using feedline::Batch;
using feedline::Loader;
using feedline::LoaderOptions;

namespace {

// One data set for the whole file (75 images in 3 classes).
const std::string& DataDir() {
  // Static, so removed at exit (a forked child leaves with _exit and does not remove it).
  static const struct DataSet {
    DataSet() { t::MakeSmallImageFolder(dir.path(), 3, 25, 1); }
    t::TempDir dir;
  } data;
  return data.dir.path();
}

std::unique_ptr<Loader> MakeLoader(LoaderOptions o) {
  auto loader = Loader::Create(std::move(o));
  REQUIRE(loader.ok());
  return std::move(*loader);
}

struct EpochData {
  std::vector<int64_t> indices;
  std::vector<int64_t> labels;
  std::vector<std::vector<uint8_t>> images;  // one per batch
};

EpochData RunEpoch(Loader& loader) {
  EpochData out;
  for (absl::StatusOr<Batch>& b : loader) {
    REQUIRE(b.ok());
    out.indices.insert(out.indices.end(), b->indices(), b->indices() + b->size());
    out.labels.insert(out.labels.end(), b->labels(), b->labels() + b->size());
    out.images.emplace_back(b->images(), b->images() + b->image_bytes());
  }
  return out;
}

LoaderOptions Small() {
  return LoaderOptions(DataDir()).batch_size(8).size(32).resize_size(40).seed(5);
}

}  // namespace

TEST_CASE("exactly once per epoch at every concurrency level", "[pipeline]") {
  for (int workers : {1, 2, 4, 8}) {
    for (int prefetch : {1, 3}) {
      for (int io : {1, 5}) {
        auto loader = MakeLoader(Small().workers(workers).prefetch(prefetch).io_depth(io));
        REQUIRE(loader->num_batches() == 10);  // ceil(75 / 8)
        EpochData e = RunEpoch(*loader);
        INFO("workers=" << workers << " prefetch=" << prefetch << " io=" << io);
        REQUIRE(e.indices.size() == 75);
        std::set<int64_t> distinct(e.indices.begin(), e.indices.end());
        REQUIRE(distinct.size() == 75);
        for (size_t i = 0; i < e.indices.size(); ++i) {
          REQUIRE(e.labels[i] == t::Files(*loader).samples[size_t(e.indices[i])].label);
        }
      }
    }
  }
}

TEST_CASE("the same seed gives the same bytes whatever the worker count", "[pipeline]") {
  for (auto transform : {feedline::Transform::kTrain, feedline::Transform::kEval}) {
    auto a = MakeLoader(Small().workers(1).prefetch(1).transform(transform));
    auto b = MakeLoader(Small().workers(6).prefetch(4).io_depth(3).transform(transform));
    EpochData ea = RunEpoch(*a), eb = RunEpoch(*b);
    REQUIRE(ea.indices == eb.indices);
    REQUIRE(ea.images == eb.images);
    EpochData ea2 = RunEpoch(*a);  // the next epoch differs
    REQUIRE(ea2.indices != ea.indices);
    b->set_epoch(1);
    REQUIRE(RunEpoch(*b).images == ea2.images);  // set_epoch reproduces it
  }
}

TEST_CASE("held batches stay intact and never block the loader", "[pipeline]") {
  auto loader = MakeLoader(Small().workers(3).prefetch(2).drop_last(true));
  std::vector<Batch> held;
  std::vector<std::vector<uint8_t>> copies;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      REQUIRE(b->size() == 8);
      held.push_back(*b);
      copies.emplace_back(b->images(), b->images() + b->image_bytes());
    }
  }
  REQUIRE(held.size() == 27);  // 3 epochs x 9 full batches, 2 batches of ring depth
  for (size_t i = 0; i < held.size(); ++i) {
    REQUIRE(std::equal(copies[i].begin(), copies[i].end(), held[i].images()));
  }
  // Batches outlive their loader.
  loader.reset();
  REQUIRE(std::equal(copies[0].begin(), copies[0].end(), held[0].images()));
}

TEST_CASE("slots are recycled: no fresh batch memory per batch in steady state", "[pipeline]") {
  // The consumer holds each batch until the next one is handed out (as `for x, y in loader`
  // does in Python), and takes its time, so the ring is full whenever it gives a batch back.
  for (int prefetch : {1, 2, 4}) {
    auto loader = MakeLoader(Small().workers(2).prefetch(prefetch));
    int64_t batches = 0;
    for (int epoch = 0; epoch < 6; ++epoch) {
      auto run = loader->StartEpoch();
      absl::StatusOr<Batch> held = run->Next();
      while (held.ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        absl::StatusOr<Batch> next = run->Next();
        held = std::move(next);
        ++batches;
      }
      REQUIRE(absl::IsOutOfRange(held.status()));
    }
    INFO("prefetch " << prefetch);
    REQUIRE(batches == 60);
    // The ring, the held batch and the one being handed out: at most prefetch + 2 alive, all
    // of them kept for reuse, so over 60 batches no more than that many were ever allocated
    // (without recycling: about one per batch).
    REQUIRE(loader->stats().slots_created <= prefetch + 2);
  }
}

TEST_CASE("stopping mid-epoch ends the workers and frees the slots", "[pipeline]") {
  auto loader = MakeLoader(Small().workers(4).prefetch(2));
  for (int round = 0; round < 5; ++round) {
    auto epoch = loader->StartEpoch();
    auto first = epoch->Next();
    REQUIRE(first.ok());
    // The workers now block on a full ring; dropping the epoch must not hang.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    epoch.reset();
  }
  // Starting an epoch cancels the previous one.
  auto e1 = loader->StartEpoch();
  REQUIRE(e1->Next().ok());
  auto e2 = loader->StartEpoch();
  REQUIRE(absl::IsCancelled(e1->Next().status()));
  int n = 0;
  while (e2->Next().ok()) ++n;
  REQUIRE(n == 10);
  e1.reset();
  e2.reset();
  // e2's end started the next epoch ahead: its ring and the batches its workers assemble are
  // slots of its own (up to 5 seen here). Dropped, only the ring's cached slots remain
  // (prefetch + 2 for recycling).
  loader->DropAhead();
  REQUIRE(loader->stats().slots_allocated <= 4);
  // The loader destroyed while an epoch is alive: the epoch ends cleanly.
  auto e3 = loader->StartEpoch();
  REQUIRE(e3->Next().ok());
  loader.reset();
  absl::StatusOr<Batch> after = e3->Next();
  REQUIRE(absl::IsCancelled(after.status()));
}

TEST_CASE("resources change while running; every sample still comes once", "[pipeline]") {
  // One epoch's work counted: no head start of the next one in the stage counters.
  auto loader =
      MakeLoader(Small().workers(1).prefetch(1).io_depth(1).epoch_head_start(false));
  auto epoch = loader->StartEpoch();
  std::vector<int64_t> seen;
  int i = 0;
  while (true) {
    auto b = epoch->Next();
    if (absl::IsOutOfRange(b.status())) break;
    REQUIRE(b.ok());
    seen.insert(seen.end(), b->indices(), b->indices() + b->size());
    ++i;
    loader->set_workers(1 + i % 4);
    loader->set_prefetch(1 + (i * 3) % 5);
    loader->set_io_depth(1 + i % 3);
  }
  std::set<int64_t> distinct(seen.begin(), seen.end());
  REQUIRE(seen.size() == 75);
  REQUIRE(distinct.size() == 75);
  feedline::Stats s = loader->stats();
  REQUIRE(s.samples == 75);
  REQUIRE(s.batches == 10);
  REQUIRE(s.stages.size() == 3);
  REQUIRE(s.stages[1].items == 75);
  REQUIRE(s.stages[1].busy_s > 0);
}

TEST_CASE("a failed sample reaches the consumer at its batch; skip replaces it", "[pipeline]") {
  t::TempDir dir;
  t::MakeSmallImageFolder(dir.path(), 2, 10, 3);
  const std::string bad = dir.path() + "/class1/img004.jpg";
  std::string bytes = t::ReadFile(bad);
  t::WriteFile(bad, bytes.substr(0, bytes.size() / 3));  // truncated
  const std::string text = dir.path() + "/class0/zz_notes.jpg";
  t::WriteFile(text, "not an image");

  SECTION("raise") {
    auto loader = MakeLoader(LoaderOptions(dir.path()).batch_size(4).size(32).shuffle(false));
    auto epoch = loader->StartEpoch();
    std::vector<std::string> errors;
    int ok = 0;
    while (true) {
      auto b = epoch->Next();
      if (absl::IsOutOfRange(b.status())) break;
      if (!b.ok()) {
        REQUIRE((absl::IsDataLoss(b.status()) || absl::IsInvalidArgument(b.status())));
        errors.emplace_back(b.status().message());
      } else {
        ++ok;
      }
    }
    // 21 files, batch 4: zz_notes is index 10 (batch 2), class1/img004 is index 15 (batch 3).
    REQUIRE(errors.size() == 2);
    REQUIRE(errors[0].find(text) != std::string::npos);
    REQUIRE(errors[1].find(bad) != std::string::npos);
    REQUIRE(ok == 4);
  }
  SECTION("skip") {
    auto loader = MakeLoader(
        LoaderOptions(dir.path()).batch_size(4).size(32).on_error(feedline::OnError::kSkip));
    int samples = 0;
    for (auto& b : *loader) {
      REQUIRE(b.ok());
      samples += int(b->size());
      for (int64_t i = 0; i < b->size(); ++i) {
        const std::string& path = t::Files(*loader).samples[size_t(b->indices()[i])].path;
        REQUIRE(path != bad);
        REQUIRE(path != text);
      }
    }
    REQUIRE(samples == 21);
    feedline::Stats s = loader->stats();
    REQUIRE(s.error_count >= 2);
    std::set<std::string> paths;
    for (auto& e : s.errors) paths.insert(e.path);
    REQUIRE(paths.count(bad) == 1);
    REQUIRE(paths.count(text) == 1);
  }
}

TEST_CASE("bad options and sources give clear errors", "[pipeline]") {
  auto expect = [](LoaderOptions o, absl::StatusCode code, const std::string& needle) {
    auto l = Loader::Create(std::move(o));
    REQUIRE(!l.ok());
    REQUIRE(l.status().code() == code);
    REQUIRE(std::string(l.status().message()).find(needle) != std::string::npos);
  };
  expect(Small().batch_size(0), absl::StatusCode::kInvalidArgument, "batch_size");
  expect(Small().scale(0.9, 0.1), absl::StatusCode::kInvalidArgument, "scale");
  expect(Small().rank(2).world_size(2), absl::StatusCode::kInvalidArgument, "rank");
  expect(Small().prefetch(65), absl::StatusCode::kInvalidArgument, "prefetch");
  expect(Small().with_source("/nonexistent/dir"), absl::StatusCode::kNotFound, "/nonexistent/dir");
  expect(Small().batch_size(1024).size(512).memory_budget(1 << 20).prefetch(4),
         absl::StatusCode::kResourceExhausted, "memory_budget");
}

// Resident pages of this process, in bytes (/proc/self/statm's second field).
int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * int64_t(::sysconf(_SC_PAGESIZE));
}

TEST_CASE("slots of variable fields are resident only where written", "[pipeline]") {
  // A document slot as the packed text loader makes it: 64 samples of up to 65,536 int32 ids,
  // each written at its stride with a few hundred bytes.
  const feedline::internal::SlotLayout ragged = feedline::internal::SlotLayout::Make(
      feedline::Schema({feedline::Field("ids", feedline::DType::kInt32,
                                        {feedline::Dim::UpTo(65536)})
                            .collate(feedline::Collate::kRagged)}),
      64);
  REQUIRE(ragged.fill == feedline::Fill::kSparse);
  REQUIRE(ragged.arena_bytes >= size_t{16} << 20);
  const feedline::internal::SlotLayout images = feedline::internal::SlotLayout::Make(
      feedline::Schema({feedline::Field("image", feedline::DType::kUint8, {3, 224, 224})}), 64);
  REQUIRE(images.fill == feedline::Fill::kDense);
  feedline::HostAllocator* a = feedline::DefaultHostAllocator();
  // Four slots' worth: with a huge page per touched stride they were resident whole (64 MiB).
  std::vector<uint8_t*> slots;
  const int64_t before = ResidentBytes();
  for (int k = 0; k < 4; ++k) {
    auto* p = static_cast<uint8_t*>(a->Allocate(ragged.arena_bytes, ragged.fill));
    for (int64_t i = 0; i < 64; ++i) {
      std::memset(p + size_t(i) * size_t(ragged.fields[0].sample_bytes), 1, 200);
    }
    slots.push_back(p);
  }
  const int64_t grew = ResidentBytes() - before;
  INFO("resident growth " << grew << " bytes for 256 writes of 200 bytes");
  CHECK(grew < int64_t{8} << 20);
  for (uint8_t* p : slots) a->Free(p, ragged.arena_bytes);
}

TEST_CASE("slot pool: every slot constructed is destroyed, across threads", "[pipeline]") {
  struct CountingAllocator : feedline::HostAllocator {
    std::atomic<int> live{0};
    void* Allocate(size_t bytes, feedline::Fill) override {
      live++;
      return ::operator new(bytes);
    }
    void Free(void* p, size_t) override {
      live--;
      ::operator delete(p);
    }
    const char* name() const override { return "counting"; }
  } alloc;
  {
    auto layout =
        std::make_shared<const feedline::internal::SlotLayout>(feedline::internal::SlotLayout::Make(
            feedline::Schema({feedline::Field("x", feedline::DType::kUint8, {256})}), 4));
    auto pool = std::make_shared<feedline::SlotPool>(&alloc, layout);
    pool->set_keep(3);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&pool] {
        for (int i = 0; i < 2000; ++i) {
          auto a = pool->Acquire();
          auto b = pool->Acquire();
          a->field_data(0)[0] = 1;
          b->field_data(0)[1023] = 2;
        }
      });
    }
    for (auto& th : threads) th.join();
    REQUIRE(pool->cached() <= 3);
    REQUIRE(alloc.live.load() == pool->allocated());
    auto held = pool->Acquire();
    pool.reset();  // a slot outliving its pool is freed when released
    REQUIRE(alloc.live.load() == 1);
  }
  REQUIRE(alloc.live.load() == 0);
}

TEST_CASE("synthetic samples: the pipeline alone, every sample once", "[pipeline]") {
  // (No epoch head start: the third epoch's first samples would be counted too.)
  auto loader =
      MakeLoader(Small().synthetic(true).workers(3).batch_size(7).epoch_head_start(false));
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::multiset<int64_t> seen;
    for (auto& b : *loader) {
      REQUIRE(b.ok());
      for (int64_t i = 0; i < b->size(); ++i) {
        const int64_t index = b->indices()[i];
        seen.insert(index);
        const uint8_t* px = b->images() + i * 3 * 32 * 32;
        REQUIRE(px[0] == uint8_t(index & 0xFF));
        REQUIRE(px[3 * 32 * 32 - 1] == uint8_t(index & 0xFF));
      }
    }
    REQUIRE(seen.size() == 75);
    REQUIRE(std::set<int64_t>(seen.begin(), seen.end()).size() == 75);
  }
  REQUIRE(loader->stats().stages[0].items == 150);  // counted, though nothing was read
}
