// Soak: many loaders over many epochs, created, partly consumed and dropped in every way a
// training script does it (full epochs, `break` after a few batches, batches held past the
// loader, cancellation with the ring full, a new epoch started over a running one, failing
// samples, several loaders alive at once, list-file and tar sources). Afterwards memory must be
// flat, and no thread or file descriptor may be left behind.
//
// The figure that matters is printed: resident memory growth across the last three quarters of
// the iterations (the first quarter warms up malloc's arenas, the decoders' buffers, ...).
// Under sanitizers the memory bound is not asserted (their allocators quarantine freed memory
// and keep shadow memory), the run is shorter, and LeakSanitizer checks the heap at exit.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "feedline/feedline.h"
#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FEEDLINE_SOAK_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define FEEDLINE_SOAK_SANITIZED 1
#endif
#endif
#ifndef FEEDLINE_SOAK_SANITIZED
#define FEEDLINE_SOAK_SANITIZED 0
#endif

namespace t = feedline::testing;
using feedline::Batch;
using feedline::Loader;
using feedline::LoaderOptions;

namespace {

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

int CountEntries(const char* dir) {
  int n = 0;
  if (DIR* d = opendir(dir)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}
int Threads() { return CountEntries("/proc/self/task"); }
// The names of the process's threads (for the failure message).
std::string ThreadNames() {
  std::string names;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      names += name + " ";
    }
    closedir(d);
  }
  return names;
}
int OpenFds() { return CountEntries("/proc/self/fd") - 1; }  // less the one opendir holds

// Threads are joined by the destructors, so the count should be back at once; allow the
// kernel a moment to reap them from /proc.
bool ThreadsBackTo(int baseline) {
  for (int i = 0; i < 200; ++i) {
    if (Threads() <= baseline) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The thread count once the ones that have been joined are gone from /proc: a joined thread
// can stay listed in /proc/self/task for a moment after join() returns.
int SettledThreads() {
  int low = Threads();
  for (int i = 0; i < 20; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    low = std::min(low, Threads());
  }
  return low;
}

struct SoakData {
  t::TempDir dir;
  std::string folder, bad_folder, list, shard;
  SoakData() {
    folder = dir.path() + "/folder";
    t::MakeSmallImageFolder(folder, 3, 12, 7);  // 36 images
    // The same with a truncated JPEG and a text file among the images.
    bad_folder = dir.path() + "/bad";
    t::MakeSmallImageFolder(bad_folder, 2, 10, 8);
    std::string bytes = t::ReadFile(bad_folder + "/class1/img003.jpg");
    t::WriteFile(bad_folder + "/class1/img003.jpg", bytes.substr(0, bytes.size() / 2));
    t::WriteFile(bad_folder + "/class0/zz.jpg", "not an image");
    list = dir.path() + "/list.txt";
    std::string lines;
    for (int c = 0; c < 3; ++c) {
      for (int i = 0; i < 12; i += 2) {
        char line[64];
        std::snprintf(line, sizeof(line), "folder/class%d/img%03d.jpg %d\n", c, i, c);
        lines += line;
      }
    }
    t::WriteFile(list, lines);
    std::vector<std::pair<std::string, std::string>> members;
    for (int i = 0; i < 12; ++i) {
      char key[32];
      std::snprintf(key, sizeof(key), "s%04d", i);
      members.emplace_back(std::string(key) + ".jpg", t::PhotoJpeg(40 + i, 56 - i, uint64_t(i)));
      members.emplace_back(std::string(key) + ".cls", std::to_string(i % 4));
    }
    shard = dir.path() + "/shard-000000.tar";
    t::WriteFile(shard, t::Tar(members));
  }
};

std::unique_ptr<Loader> Make(LoaderOptions o) {
  auto loader = Loader::Create(std::move(o));
  INFO(loader.status().ToString());
  REQUIRE(loader.ok());
  return std::move(*loader);
}

// Consumes up to `n` batches of `epoch` (all when n < 0); returns how many came.
int Consume(feedline::Epoch& epoch, int n, std::vector<Batch>* keep = nullptr) {
  int got = 0;
  while (n < 0 || got < n) {
    absl::StatusOr<Batch> b = epoch.Next();
    if (absl::IsOutOfRange(b.status())) break;
    ++got;
    if (b.ok() && keep != nullptr) keep->push_back(*b);
  }
  return got;
}

// One iteration: a scenario chosen by `i`. Everything it creates is gone when it returns,
// except what it deliberately leaves in `held` (batches kept past their loader).
void Scenario(const SoakData& d, int i, std::vector<Batch>* held) {
  const LoaderOptions base = LoaderOptions(d.folder)
                                 .batch_size(4 + i % 5)
                                 .size(24 + 8 * (i % 3))
                                 .resize_size(40)
                                 .seed(uint64_t(i))
                                 .workers(1 + i % 4)
                                 .prefetch(1 + i % 3)
                                 .io_depth(1 + i % 2);
  switch (i % 9) {
    case 0: {  // full epochs, range-for, eval transform in NHWC
      auto loader = Make(LoaderOptions(base)
                             .transform(feedline::Transform::kEval)
                             .layout(feedline::Layout::kNHWC));
      for (int e = 0; e < 2; ++e) {
        int64_t n = 0;
        for (absl::StatusOr<Batch>& b : *loader) {
          REQUIRE(b.ok());
          n += b->size();
        }
        REQUIRE(n == 36);
      }
      break;
    }
    case 1: {  // `break` after a few batches, every epoch
      auto loader = Make(base);
      for (int e = 0; e < 3; ++e) {
        int k = 0;
        for (absl::StatusOr<Batch>& b : *loader) {
          REQUIRE(b.ok());
          if (++k == 2) break;
        }
      }
      break;
    }
    case 2: {  // batches held past the loader's end (released by the caller later)
      auto loader = Make(base);
      auto epoch = loader->StartEpoch();
      Consume(*epoch, 3, held);
      loader.reset();  // with the epoch still running
      epoch.reset();
      break;
    }
    case 3: {  // cancel with the ring full: the workers are blocked on admission
      auto loader = Make(LoaderOptions(base).prefetch(1 + i % 2));
      auto epoch = loader->StartEpoch();
      REQUIRE(epoch->Next().ok());
      std::this_thread::sleep_for(std::chrono::milliseconds(15));
      epoch->Cancel();
      REQUIRE(absl::IsCancelled(epoch->Next().status()));
      epoch->Cancel();
      break;
    }
    case 4: {  // a new epoch over a running one, then the loader dropped before its epoch
      auto loader = Make(base);
      auto e1 = loader->StartEpoch();
      Consume(*e1, 1);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      auto e2 = loader->StartEpoch();
      REQUIRE(absl::IsCancelled(e1->Next().status()));
      Consume(*e2, 2);
      loader.reset();
      REQUIRE(absl::IsCancelled(e2->Next().status()));
      break;
    }
    case 5: {  // failing samples: raised at their batch, or skipped and counted
      const bool skip = (i / 9) % 2 == 0;
      auto loader =
          Make(LoaderOptions(base)
                   .with_source(d.bad_folder)
                   .on_error(skip ? feedline::OnError::kSkip : feedline::OnError::kRaise));
      auto epoch = loader->StartEpoch();
      int errors = 0;
      while (true) {
        absl::StatusOr<Batch> b = epoch->Next();
        if (absl::IsOutOfRange(b.status())) break;
        errors += !b.ok();
      }
      if (skip) {
        REQUIRE(errors == 0);
        REQUIRE(loader->stats().error_count >= 2);
      } else {
        REQUIRE(errors >= 1);
      }
      break;
    }
    case 6: {  // several loaders alive at once, consumed in turn, dropped in creation order
      std::vector<std::unique_ptr<Loader>> loaders;
      std::vector<std::unique_ptr<feedline::Epoch>> epochs;
      for (int k = 0; k < 3; ++k) {
        loaders.push_back(Make(LoaderOptions(base).seed(uint64_t(i * 3 + k))));
        epochs.push_back(loaders.back()->StartEpoch());
      }
      for (int round = 0; round < 2; ++round) {
        for (auto& e : epochs) Consume(*e, 1, round == 1 ? held : nullptr);
      }
      loaders.clear();
      epochs.clear();
      break;
    }
    case 7: {  // a list file: one full epoch, then half of one
      auto loader = Make(LoaderOptions(base).with_source(d.list));
      auto e1 = loader->StartEpoch();
      REQUIRE(Consume(*e1, -1) == e1->num_batches());
      e1.reset();
      auto e2 = loader->StartEpoch();
      Consume(*e2, int(e2->num_batches() / 2));
      break;
    }
    case 8: {  // a tar shard (its descriptor must be closed with the loader), resources changed
      LoaderOptions o = base;
      o.source("").shards({d.shard});
      auto loader = Make(std::move(o));
      auto epoch = loader->StartEpoch();
      Consume(*epoch, 1);
      loader->set_workers(1 + (i + 1) % 4);
      loader->set_prefetch(1 + (i + 2) % 3);
      Consume(*epoch, 1);
      break;
    }
  }
}

}  // namespace

TEST_CASE("soak: loaders made, partly consumed and dropped; memory flat, nothing left", "[soak]") {
  const SoakData data;
  const int iterations = FEEDLINE_SOAK_SANITIZED ? 108 : 1080;  // rounds of the 9 scenarios
  const int warmup = iterations / 4;
  // Runtimes that start a helper thread with the first thread (ThreadSanitizer's background
  // thread) do it now, before the baseline.
  std::thread([] {}).join();
  const int threads_before = SettledThreads();
  const int fds_before = OpenFds();
  const auto start = std::chrono::steady_clock::now();

  std::vector<Batch> held;
  int64_t rss_after_warmup = 0, rss_peak = 0;
  for (int i = 0; i < iterations; ++i) {
    Scenario(data, i, &held);
    if (held.size() > 12) held.erase(held.begin(), held.begin() + 6);  // some released, some kept
    INFO("iteration " << i << " scenario " << i % 9);
    const bool threads_back = ThreadsBackTo(threads_before);
    INFO(threads_before << " threads before: now " << ThreadNames());
    REQUIRE(threads_back);
    REQUIRE(OpenFds() == fds_before);
    const int64_t rss = ResidentBytes();
    if (i == warmup - 1) rss_after_warmup = rss;
    if (i >= warmup) rss_peak = std::max(rss_peak, rss);
  }
  held.clear();
  const int64_t rss_end = ResidentBytes();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double growth_mib = double(rss_peak - rss_after_warmup) / (1 << 20);
  std::printf(
      "soak: %d iterations in %.1f s; RSS after warm-up %.1f MiB, peak after %.1f MiB, "
      "end %.1f MiB: growth %.2f MiB over the last %d iterations%s\n",
      iterations, seconds, double(rss_after_warmup) / (1 << 20), double(rss_peak) / (1 << 20),
      double(rss_end) / (1 << 20), growth_mib, iterations - warmup,
      FEEDLINE_SOAK_SANITIZED ? " (sanitizer build: not asserted)" : "");
  std::fflush(stdout);
  REQUIRE(ThreadsBackTo(threads_before));
  REQUIRE(OpenFds() == fds_before);
#if !FEEDLINE_SOAK_SANITIZED
  CHECK(growth_mib < 32.0);
#endif
}
