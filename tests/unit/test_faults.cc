// I/O faults through an injected data set (EIO, a hung read, files that vanish) and real files
// changed under a running loader. Whatever storage does, the consumer gets a clear error at the
// batch of the sample (or a replacement under kSkip), and nothing hangs.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "feedline/feedline.h"
#include "test_util.h"

namespace t = feedline::testing;
using feedline::Batch;
using feedline::LoaderOptions;

namespace {

// Reads real files, failing the samples in `eio` with EIO and blocking forever (until the
// test ends) on the samples in `hang`: a fault-injecting data set through the public seam, as
// leveldb's FaultInjectionTestEnv wraps its Env.
class FaultyDataset final : public feedline::DatasetWrapper {
 public:
  FaultyDataset(std::shared_ptr<const feedline::Dataset> files, std::set<int64_t> eio,
                std::set<int64_t> hang, std::shared_ptr<std::atomic<bool>> release)
      : DatasetWrapper(std::move(files)),
        eio_(std::move(eio)),
        hang_(std::move(hang)),
        release_(std::move(release)) {}
  absl::Status Read(int64_t index, feedline::Record* record) const override {
    if (eio_.count(index)) {
      return absl::DataLossError(absl::StrCat(Describe(index), ": read: Input/output error"));
    }
    if (hang_.count(index)) {
      while (!release_->load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return DatasetWrapper::Read(index, record);
  }

 private:
  std::set<int64_t> eio_, hang_;
  std::shared_ptr<std::atomic<bool>> release_;
};

std::unique_ptr<feedline::Loader> FaultyLoader(const std::string& dir, LoaderOptions o,
                                               std::set<int64_t> eio, std::set<int64_t> hang,
                                               std::shared_ptr<std::atomic<bool>> release) {
  auto files = feedline::FileDataset::Open(dir);
  REQUIRE(files.ok());
  auto transform = feedline::image::MakeTransform(o);
  REQUIRE(transform.ok());
  auto loader = feedline::Loader::Create(
      std::make_shared<FaultyDataset>(*files, std::move(eio), std::move(hang), release), *transform,
      o);
  REQUIRE(loader.ok());
  return std::move(*loader);
}

}  // namespace

TEST_CASE("EIO: raised at its batch, or replaced under skip", "[faults]") {
  t::TempDir dir;
  t::MakeSmallImageFolder(dir.path(), 2, 8, 9);  // 16 samples
  auto release = std::make_shared<std::atomic<bool>>(true);
  auto o = LoaderOptions().batch_size(4).size(24).shuffle(false).workers(2);
  {
    auto loader = FaultyLoader(dir.path(), o, {5, 13}, {}, release);
    auto epoch = loader->StartEpoch();
    std::vector<std::string> outcome;
    for (int i = 0; i < 4; ++i) {
      auto b = epoch->Next();
      outcome.push_back(b.ok() ? "ok" : std::string(b.status().message()));
    }
    REQUIRE(absl::IsOutOfRange(epoch->Next().status()));
    REQUIRE(outcome[0] == "ok");
    REQUIRE(outcome[1].find("img005.jpg: read: Input/output error") != std::string::npos);
    REQUIRE(outcome[2] == "ok");
    REQUIRE(outcome[3].find("class1/img005.jpg") != std::string::npos);
  }
  {
    auto loader =
        FaultyLoader(dir.path(), o.on_error(feedline::OnError::kSkip), {5, 13}, {}, release);
    int n = 0;
    for (auto& b : *loader) {
      REQUIRE(b.ok());
      for (int64_t i = 0; i < b->size(); ++i) {
        REQUIRE(b->indices()[i] != 5);
        REQUIRE(b->indices()[i] != 13);
      }
      n += int(b->size());
    }
    REQUIRE(n == 16);
    REQUIRE(loader->stats().error_count == 2);
  }
  {
    // A flood of failures becomes an error under skip when max_errors says so.
    std::set<int64_t> most;
    for (int64_t i = 0; i < 14; ++i) most.insert(i);
    auto loader = FaultyLoader(dir.path(), o.on_error(feedline::OnError::kSkip).max_errors(3), most,
                               {}, release);
    auto epoch = loader->StartEpoch();
    absl::Status st;
    for (int i = 0; i < 4 && st.ok(); ++i) st = epoch->Next().status();
    REQUIRE(absl::IsDataLoss(st));
    REQUIRE(std::string(st.message()).find("max_errors=3") != std::string::npos);
  }
}

TEST_CASE("a hung read is bounded by the timeout and does not hang shutdown", "[faults]") {
  t::TempDir dir;
  t::MakeSmallImageFolder(dir.path(), 1, 12, 4);
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto o = LoaderOptions().batch_size(4).size(24).shuffle(false).workers(2).io_depth(2);
  SECTION("raise") {
    auto loader = FaultyLoader(dir.path(), o.read_timeout_ms(300), {}, {2}, release);
    auto epoch = loader->StartEpoch();
    auto first = epoch->Next();
    REQUIRE(absl::IsDeadlineExceeded(first.status()));
    REQUIRE(std::string(first.status().message()).find("img002.jpg: read did not complete") !=
            std::string::npos);
    // The replacement reader keeps the epoch going.
    REQUIRE(epoch->Next().ok());
    REQUIRE(epoch->Next().ok());
    REQUIRE(absl::IsOutOfRange(epoch->Next().status()));
  }
  SECTION("skip") {
    auto loader = FaultyLoader(
        dir.path(), o.read_timeout_ms(300).on_error(feedline::OnError::kSkip), {}, {2}, release);
    int n = 0;
    for (auto& b : *loader) {
      REQUIRE(b.ok());
      n += int(b->size());
    }
    REQUIRE(n == 12);
  }
  SECTION("stopping while a read hangs, no timeout") {
    auto loader = FaultyLoader(dir.path(), o.read_timeout_ms(0), {}, {0}, release);
    auto epoch = loader->StartEpoch();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const auto start = std::chrono::steady_clock::now();
    epoch.reset();  // must not wait for the hung read
    loader.reset();
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  }
  release->store(true);  // let the abandoned threads finish
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
}

TEST_CASE("files deleted, emptied or replaced under a running loader", "[faults]") {
  t::TempDir dir;
  t::MakeSmallImageFolder(dir.path(), 1, 12, 6);
  auto loader = feedline::Loader::Create(
      LoaderOptions(dir.path()).batch_size(4).size(24).shuffle(false).workers(1).prefetch(1));
  REQUIRE(loader.ok());
  auto epoch = (*loader)->StartEpoch();
  REQUIRE(epoch->Next().ok());  // batch 0; batch 1 may be in flight, batch 2 is not read yet
  const std::string base = dir.path() + "/class0/";
  REQUIRE(::unlink((base + "img008.jpg").c_str()) == 0);
  t::WriteFile(base + "img009.jpg", "");
  REQUIRE(::unlink((base + "img010.jpg").c_str()) == 0);
  REQUIRE(::mkdir((base + "img010.jpg").c_str(), 0755) == 0);
  (void)epoch->Next();
  auto last = epoch->Next();
  REQUIRE(!last.ok());
  // The first failing sample of the batch is the one reported.
  REQUIRE(absl::IsNotFound(last.status()));
  REQUIRE(std::string(last.status().message()).find("img008.jpg") != std::string::npos);
  const feedline::Stats s = (*loader)->stats();
  REQUIRE(s.error_count == 3);
  std::set<std::string> causes;
  for (const auto& e : s.errors) {
    REQUIRE(e.cause.find(e.path) == std::string::npos);  // named once, in `path`
    causes.insert(e.path + ": " + e.cause);
  }
  bool empty = false, dir_err = false;
  for (const auto& c : causes) {
    empty |= c.find("img009.jpg: empty file") != std::string::npos;
    dir_err |= c.find("img010.jpg") != std::string::npos;
  }
  REQUIRE(empty);
  REQUIRE(dir_err);
}

TEST_CASE("a child process forked while a loader runs does not deadlock", "[faults]") {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  WARN("skipped under sanitizers: they do not support threads after a multi-threaded fork");
  return;
#endif
  t::TempDir dir;
  t::MakeSmallImageFolder(dir.path(), 1, 12, 8);
  auto loader = feedline::Loader::Create(
      LoaderOptions(dir.path()).batch_size(4).size(24).workers(2).prefetch(1));
  REQUIRE(loader.ok());
  auto epoch = (*loader)->StartEpoch();
  REQUIRE(epoch->Next().ok());  // workers now block on the full ring, holding nothing
  pid_t pid = fork();
  if (pid == 0) {
    // The child: drop the parent's epoch and loader (their threads are not here), then load
    // with a fresh loader.
    epoch.reset();
    loader->reset();
    auto fresh =
        feedline::Loader::Create(LoaderOptions(dir.path()).batch_size(4).size(24).workers(2));
    int n = 0;
    if (fresh.ok()) {
      for (auto& b : **fresh) n += b.ok() ? int(b->size()) : 0;
    }
    _exit(n == 12 ? 0 : 1);
  }
  REQUIRE(pid > 0);
  int status = -1;
  for (int i = 0; i < 300; ++i) {  // up to 30 s: a deadlock shows as a timeout here
    if (waitpid(pid, &status, WNOHANG) == pid) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!WIFEXITED(status)) kill(pid, SIGKILL);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  int n = 4;
  while (true) {
    auto b = epoch->Next();
    if (!b.ok()) break;
    n += int(b->size());
  }
  REQUIRE(n == 12);  // the parent goes on
}
