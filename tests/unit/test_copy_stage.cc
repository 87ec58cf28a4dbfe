// The copy stage (src/cuda/device_cuda.cc, the real code) on the CUDA runtime stub
// (tests/cuda_stub): values against the host path, stream ordering that a missing wait breaks,
// the caller's current device, pinned-slot lifetime, and CUDA failures reaching the consumer.
// A separate program: it links the stub in place of cudart. Also run under ThreadSanitizer and
// AddressSanitizer by tests/run_all.sh.
#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>
#include <vector>

#include "cuda_stub.h"
#include "feedline/error.h"
#include "feedline/feedline.h"
#include "loader_run.h"
#include "test_util.h"

namespace t = feedline::testing;
using feedline::Batch;
using feedline::DType;
using feedline::Layout;
using feedline::Loader;
using feedline::LoaderOptions;

namespace {

// 39 images in 3 classes: batches of 8 leave a partial last batch of 7.
const std::string& DataDir() {
  static const struct DataSet {
    DataSet() { t::MakeSmallImageFolder(dir.path(), 3, 13, 7); }
    t::TempDir dir;
  } data;
  return data.dir.path();
}

LoaderOptions Small() {
  return LoaderOptions(DataDir())
      .batch_size(8)
      .shuffle(false)
      .transform(feedline::Transform::kEval)
      .size(24)
      .resize_size(28)
      .workers(2)
      .prefetch(2)
      .io_depth(2);
}

std::unique_ptr<Loader> MakeLoader(LoaderOptions o) {
  auto loader = Loader::Create(std::move(o));
  INFO(loader.status().ToString());
  REQUIRE(loader.ok());
  return std::move(*loader);
}

struct HostBatch {
  std::vector<int64_t> indices, labels;
  std::vector<uint8_t> image;
};

std::vector<uint8_t> Bytes(const void* p, int64_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  return std::vector<uint8_t>(b, b + n);
}

// One epoch of the host path with the same options (device "cpu").
std::vector<HostBatch> HostEpoch(LoaderOptions o) {
  auto loader = MakeLoader(o.device("cpu"));
  std::vector<HostBatch> out;
  for (absl::StatusOr<Batch>& b : *loader) {
    REQUIRE(b.ok());
    HostBatch h;
    h.indices.assign(b->indices(), b->indices() + b->size());
    h.labels.assign(b->labels(), b->labels() + b->size());
    h.image = Bytes(b->images(), b->image_bytes());
    out.push_back(std::move(h));
  }
  return out;
}

// Device memory as the host sees it after a copy back (the host cannot dereference it).
std::vector<uint8_t> DeviceBytes(const void* p, int64_t n) {
  std::vector<uint8_t> out(static_cast<size_t>(n));
  cuda_stub::CopyToHost(out.data(), p, size_t(n));
  return out;
}

// What a check queued on a stream finds at `image` (true: the expected bytes).
bool Holds(const uint8_t* image, const std::vector<uint8_t>& want) {
  return DeviceBytes(image, int64_t(want.size())) == want;
}

// A device batch read back once the legacy stream, made to wait for it, is done.
HostBatch Read(const Batch& b) {
  REQUIRE(b.device() >= 0);
  REQUIRE(b.set_consumer_stream(nullptr).ok());
  REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
  HostBatch h;
  h.indices.assign(b.indices(), b.indices() + b.size());
  h.labels = std::vector<int64_t>(size_t(b.size()));
  cuda_stub::CopyToHost(h.labels.data(), b.labels(), size_t(b.size()) * sizeof(int64_t));
  h.image = DeviceBytes(b.images(), b.image_bytes());
  return h;
}

void RequireSame(const HostBatch& a, const HostBatch& b) {
  REQUIRE(a.indices == b.indices);
  REQUIRE(a.labels == b.labels);
  REQUIRE(a.image.size() == b.image.size());
  REQUIRE(a.image == b.image);
}

// Once the loaders and batches are gone, nothing of them is left on the device or pinned (a
// stage whose last owner was a batch is torn down by the reaper thread: a moment later).
void RequireNothingLeft() {
  for (int i = 0; i < 500; ++i) {
    const cuda_stub::Counters c = cuda_stub::Get();
    if (c.device_bytes_live == 0 && c.host_bytes_live == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const cuda_stub::Counters end = cuda_stub::Get();
  REQUIRE(end.device_bytes_live == 0);
  REQUIRE(end.host_bytes_live == 0);
}

// Resets the stub's counters once the loaders of the tests before are gone from it: a loader
// dropped while its workers are in a sample (a head start's, niced, on a busy machine) is torn
// down a moment later by a thread of its own, and its frees must not count against this test.
void FreshStub(int devices = 2) {
  RequireNothingLeft();
  cuda_stub::Reset(devices);
}

}  // namespace

TEST_CASE("device batches equal the host path's for every dtype and layout", "[cuda]") {
  FreshStub();
  for (DType dtype : {DType::kUint8, DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (Layout layout : {Layout::kNCHW, Layout::kNHWC}) {
      INFO("dtype " << int(dtype) << " layout " << int(layout));
      const LoaderOptions o = Small().dtype(dtype).layout(layout);
      const std::vector<HostBatch> host = HostEpoch(o);
      REQUIRE(host.size() == 5);
      REQUIRE(host.back().indices.size() == 7);
      auto loader = MakeLoader(LoaderOptions(o).device("cuda:0"));
      size_t i = 0;
      for (absl::StatusOr<Batch>& b : *loader) {
        REQUIRE(b.ok());
        REQUIRE(b->device() == 0);
        REQUIRE(b->dtype() == dtype);
        RequireSame(Read(*b), host[i++]);
      }
      REQUIRE(i == host.size());
    }
  }
}

TEST_CASE("a consumer stream reads a batch only after its copy", "[cuda]") {
  // The consumer's stream is made before the loader: the device prefers it, so a check queued
  // there without the wait on the batch's event would run before the copy.
  FreshStub();
  const std::vector<HostBatch> host = HostEpoch(Small());
  cudaStream_t consumer = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
  auto loader = MakeLoader(Small().device("cuda:0"));
  std::atomic<int> checked{0}, wrong{0};
  cuda_stub::Hold();
  size_t i = 0;
  for (absl::StatusOr<Batch>& b : *loader) {
    REQUIRE(b.ok());
    REQUIRE(b->set_consumer_stream(consumer).ok());
    const uint8_t* image = b->images();
    const std::vector<uint8_t> want = host[i++].image;
    cuda_stub::Enqueue(consumer, [&, image, want, keep = b->keep_alive()] {
      wrong += Holds(image, want) ? 0 : 1;
      ++checked;
    });
  }
  cuda_stub::Resume();
  REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  REQUIRE(checked == 5);
  REQUIRE(wrong == 0);
  REQUIRE(cudaStreamDestroy(consumer) == cudaSuccess);
}

TEST_CASE("a device buffer is reused only after the consumer's work on it", "[cuda]") {
  // The consumer's stream is made after the loader: the device prefers the copy stream, so the
  // copy of a later batch into a released buffer would overtake the consumer's queued check
  // unless it waits for the release. Batches are dropped as soon as their check is queued.
  FreshStub();
  const std::vector<HostBatch> host = HostEpoch(Small());
  auto loader = MakeLoader(Small().device("cuda:0"));
  cudaStream_t consumer = nullptr;
  REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
  std::atomic<int> checked{0}, wrong{0};
  for (int epoch = 0; epoch < 2; ++epoch) {
    cuda_stub::Hold();
    auto run = loader->StartEpoch();
    for (size_t i = 0;; ++i) {
      absl::StatusOr<Batch> b = run->Next();
      if (absl::IsOutOfRange(b.status())) break;
      REQUIRE(b.ok());
      REQUIRE(b->set_consumer_stream(consumer).ok());
      const uint8_t* image = b->images();
      std::vector<uint8_t> want = host[i].image;
      cuda_stub::Enqueue(consumer, [&, image, want = std::move(want)] {
        wrong += Holds(image, want) ? 0 : 1;
        ++checked;
      });
    }
    cuda_stub::Resume();
    REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
  }
  REQUIRE(checked == 10);
  REQUIRE(wrong == 0);
  // Fewer device buffers than batches: they were reused.
  REQUIRE(cuda_stub::Get().device_allocs < 10);
  REQUIRE(cudaStreamDestroy(consumer) == cudaSuccess);
}

TEST_CASE("a pinned slot returns to the ring when its copy is done, not when its batch dies",
          "[cuda]") {
  FreshStub();
  const std::vector<HostBatch> host = HostEpoch(Small());
  auto loader = MakeLoader(Small().device("cuda:0"));
  // The ring's slots are pinned before the first batch, not in the middle of training.
  const int64_t allocated_at_start = cuda_stub::Get().host_allocs;
  REQUIRE(allocated_at_start >= 2);
  std::vector<Batch> held;  // every batch of three epochs stays alive
  cuda_stub::Counters after_first;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      held.push_back(*b);
    }
    if (epoch == 0) after_first = cuda_stub::Get();
  }
  REQUIRE(held.size() == 15);
  const cuda_stub::Counters now = cuda_stub::Get();
  INFO("pinned allocations: at start " << allocated_at_start << ", after epoch 1 "
                                       << after_first.host_allocs << ", now " << now.host_allocs);
  // The held batches hold device buffers (15), not pinned slots: no pinned memory was made or
  // freed after the first epoch.
  REQUIRE(now.host_allocs == after_first.host_allocs);
  REQUIRE(now.host_frees == after_first.host_frees);
  REQUIRE(now.host_allocs <= allocated_at_start + 2);
  REQUIRE(now.device_allocs == 15);
  for (size_t i = 0; i < held.size(); ++i) RequireSame(Read(held[i]), host[i % 5]);
  // Batches outlive their loader; once all are gone, nothing of the loader is left.
  loader.reset();
  RequireSame(Read(held[14]), host[4]);
  held.clear();
  RequireNothingLeft();
  REQUIRE(cuda_stub::Get().host_allocs == cuda_stub::Get().host_frees);
}

TEST_CASE("the copy reads a slot before the ring fills it again", "[cuda]") {
  // The device is held for a whole epoch: no copy has run when the workers look for free slots,
  // so a slot given back before its copy ran would be refilled with a later batch first.
  FreshStub();
  const std::vector<HostBatch> host = HostEpoch(Small());
  auto loader = MakeLoader(Small().device("cuda:0").prefetch(1));
  cuda_stub::Hold();
  std::vector<Batch> held;
  for (absl::StatusOr<Batch>& b : *loader) {
    REQUIRE(b.ok());
    held.push_back(*b);
  }
  REQUIRE(cuda_stub::Get().copies == 0);
  cuda_stub::Resume();
  for (size_t i = 0; i < held.size(); ++i) RequireSame(Read(held[i]), host[i]);
}

TEST_CASE("the calling thread's current device is left as it was", "[cuda]") {
  FreshStub(2);
  const std::vector<HostBatch> host = HostEpoch(Small());
  for (int loader_device : {0, 1}) {
    const int caller = 1 - loader_device;
    INFO("loader on cuda:" << loader_device << ", caller on " << caller);
    REQUIRE(cudaSetDevice(caller) == cudaSuccess);
    // The loader device's legacy stream exists before the loader's own stream: the device
    // prefers it, so a consumer that waited on another device's stream would read too early.
    REQUIRE(cudaSetDevice(loader_device) == cudaSuccess);
    cuda_stub::Enqueue(nullptr, [] {});
    REQUIRE(cudaSetDevice(caller) == cudaSuccess);
    auto loader = MakeLoader(Small().device("cuda:" + std::to_string(loader_device)));
    REQUIRE(cuda_stub::Current() == caller);
    std::atomic<int> wrong{0};
    cuda_stub::Hold();
    size_t i = 0;
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      REQUIRE(b->device() == loader_device);
      REQUIRE(cuda_stub::Current() == caller);
      // The legacy stream named from the caller's thread is the batch's device's.
      REQUIRE(b->set_consumer_stream(nullptr).ok());
      REQUIRE(cuda_stub::Current() == caller);
      REQUIRE(cudaSetDevice(loader_device) == cudaSuccess);
      const uint8_t* image = b->images();
      std::vector<uint8_t> want = host[i++].image;
      cuda_stub::Enqueue(
          nullptr, [&, image, want = std::move(want)] { wrong += Holds(image, want) ? 0 : 1; });
      REQUIRE(cudaSetDevice(caller) == cudaSuccess);
    }
    cuda_stub::Resume();
    REQUIRE(cudaSetDevice(loader_device) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
    REQUIRE(cudaSetDevice(caller) == cudaSuccess);
    REQUIRE(wrong == 0);
    loader.reset();
    REQUIRE(cuda_stub::Current() == caller);
    // Every call on the loader's streams, events and memory ran with its device current.
    REQUIRE(cuda_stub::Get().foreign_device_calls == 0);
  }
  // "cuda" is the caller's current device, as in torch.
  REQUIRE(cudaSetDevice(1) == cudaSuccess);
  auto loader = MakeLoader(Small().device("cuda"));
  absl::StatusOr<Batch> b = loader->StartEpoch()->Next();
  REQUIRE(b.ok());
  REQUIRE(b->device() == 1);
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  // A GPU that cannot run the kernels (too old for sm_80 and the PTX, or an old driver) is
  // refused at creation with the reason, not at the first batch.
  cuda_stub::FailNext("CheckConvertKernel", cudaErrorNoKernelImageForDevice);
  auto old_gpu = Loader::Create(Small().device("cuda:0"));
  REQUIRE_FALSE(old_gpu.ok());
  REQUIRE(feedline::IsDeviceError(old_gpu.status()));
  REQUIRE(old_gpu.status().message().find("cannot run this build's CUDA kernels") !=
          std::string::npos);
  // A device the machine does not have is refused at creation.
  auto missing = Loader::Create(Small().device("cuda:2"));
  REQUIRE_FALSE(missing.ok());
  REQUIRE(feedline::IsDeviceError(missing.status()));
}

TEST_CASE("CUDA failures reach the consumer as device errors; nothing aborts or leaks", "[cuda]") {
  SECTION("pinned memory cannot be allocated") {
    cuda_stub::Reset();
    cuda_stub::FailNext("cudaHostAlloc", cudaErrorMemoryAllocation, 1000);
    auto loader = Loader::Create(Small().device("cuda:0"));
    if (loader.ok()) {  // or the first batch fails
      absl::StatusOr<Batch> b = (*loader)->StartEpoch()->Next();
      REQUIRE_FALSE(b.ok());
      INFO(b.status().ToString());
      REQUIRE(b.status().message().find("memory") != std::string::npos);
    } else {
      INFO(loader.status().ToString());
      REQUIRE(loader.status().message().find("memory") != std::string::npos);
    }
  }
  SECTION("a copy cannot be queued") {
    cuda_stub::Reset();
    const std::vector<HostBatch> host = HostEpoch(Small());
    {
      auto loader = MakeLoader(Small().device("cuda:0"));
      // Copies fail from the sixth on until the consumer has seen one failed batch (a copy
      // that failed ahead of the consumer is queued again when the batch is taken, so only a
      // failure at that point reaches it); later batches are copied again and arrive.
      cuda_stub::FailNext("cudaMemcpyAsync", cudaErrorIllegalAddress, 1000, /*skip=*/5);
      int failed = 0, good = 0;
      size_t i = 0;
      for (absl::StatusOr<Batch>& b : *loader) {
        if (!b.ok()) {
          ++failed;
          REQUIRE(feedline::IsDeviceError(b.status()));
          REQUIRE(b.status().message().find("cudaMemcpyAsync") != std::string::npos);
          cuda_stub::FailNext("cudaMemcpyAsync", cudaSuccess, 0);
        } else {
          RequireSame(Read(*b), host[i]);
          ++good;
        }
        ++i;
      }
      REQUIRE(failed == 1);
      REQUIRE(good == 4);
    }
    RequireNothingLeft();
  }
  SECTION("the context dies mid-epoch (a sticky error)") {
    cuda_stub::Reset();
    auto loader = MakeLoader(Small().device("cuda:0"));
    auto run = loader->StartEpoch();
    REQUIRE(run->Next().ok());
    cuda_stub::SetSticky(cudaErrorIllegalAddress);
    absl::StatusOr<Batch> b = run->Next();
    while (b.ok()) b = run->Next();  // batches copied before the error may still come
    REQUIRE(feedline::IsDeviceError(b.status()));
    REQUIRE_FALSE(absl::IsOutOfRange(b.status()));
    run.reset();
    loader.reset();  // no hang, no abort (and nothing can be freed in a dead context)
    cuda_stub::SetSticky(cudaSuccess);
  }
  SECTION("the consumer's stream cannot wait") {
    cuda_stub::Reset();
    {
      auto loader = MakeLoader(Small().device("cuda:0"));
      absl::StatusOr<Batch> b = loader->StartEpoch()->Next();
      REQUIRE(b.ok());
      cuda_stub::FailNext("cudaStreamWaitEvent", cudaErrorInvalidResourceHandle);
      absl::Status s = b->set_consumer_stream(nullptr);
      REQUIRE_FALSE(s.ok());
      REQUIRE(feedline::IsDeviceError(s));
    }
    RequireNothingLeft();
  }
  SECTION("the release cannot be recorded: the buffer waits for the consumer's stream") {
    cuda_stub::Reset();
    const std::vector<HostBatch> host = HostEpoch(Small());
    {
      auto loader = MakeLoader(Small().device("cuda:0"));
      cudaStream_t consumer = nullptr;
      REQUIRE(cudaStreamCreateWithFlags(&consumer, cudaStreamNonBlocking) == cudaSuccess);
      // Every release's event record on the consumer's stream fails. The device prefers the
      // copy stream (made first): a buffer reused without waiting for the consumer's stream
      // could be overwritten before the consumer's check runs.
      cuda_stub::FailNextOn("cudaEventRecord", consumer, cudaErrorLaunchFailure, 1000);
      std::atomic<int> wrong{0};
      size_t i = 0;
      for (absl::StatusOr<Batch>& b : *loader) {
        REQUIRE(b.ok());
        REQUIRE(b->set_consumer_stream(consumer).ok());
        const uint8_t* image = b->images();
        std::vector<uint8_t> want = host[i++].image;
        cuda_stub::Enqueue(
            consumer, [&, image, want = std::move(want)] { wrong += Holds(image, want) ? 0 : 1; });
      }
      REQUIRE(cudaStreamSynchronize(consumer) == cudaSuccess);
      REQUIRE(wrong == 0);
      REQUIRE(cudaStreamDestroy(consumer) == cudaSuccess);
    }
    RequireNothingLeft();
  }
}

TEST_CASE("copy time is measured without timing every batch's events", "[cuda]") {
  FreshStub();
  auto loader = MakeLoader(Small().device("cuda:0").batch_size(1));
  int64_t batches = 0;
  for (int epoch = 0; epoch < 2; ++epoch) {
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      ++batches;
    }
  }
  REQUIRE(batches == 78);
  const feedline::Stats s = loader->stats();
  const feedline::StageStats* copy = nullptr;
  for (const auto& st : s.stages) {
    if (st.name == "copy") copy = &st;
  }
  REQUIRE(copy != nullptr);
  REQUIRE(copy->items == 78);
  REQUIRE(copy->busy_s > 0);
  // The events the consumer waits on have timing off; a few batches are timed.
  REQUIRE(cuda_stub::Get().timed_records <= 2 * (78 / 8 + 2));
}

TEST_CASE("each DLPack stream value orders the release where it must", "[cuda]") {
  FreshStub();
  const std::vector<HostBatch> host = HostEpoch(Small());
  SECTION(
      "per-thread default stream (2): read there, the release is ordered on the legacy "
      "stream, which waits for it") {
    auto loader = MakeLoader(Small().device("cuda:0"));
    size_t i = 0;
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      REQUIRE(b->set_consumer_stream(cudaStreamPerThread).ok());
      REQUIRE(cudaStreamSynchronize(cudaStreamPerThread) == cudaSuccess);
      REQUIRE(DeviceBytes(b->images(), b->image_bytes()) == host[i++].image);
    }
    REQUIRE(cuda_stub::Get().device_syncs == 0);
  }
  SECTION("no stream (-1): the consumer synchronises; the buffer waits for the whole device") {
    auto loader = MakeLoader(Small().device("cuda:0"));
    size_t i = 0;
    int64_t released = 0;
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      REQUIRE(b->set_consumer_stream(feedline::kNoSyncStream).ok());
      REQUIRE(cudaEventSynchronize(static_cast<cudaEvent_t>(b->ready_event())) == cudaSuccess);
      REQUIRE(DeviceBytes(b->images(), b->image_bytes()) == host[i++].image);
      ++released;
    }
    // Each batch released (all but the last two when the loop ends) synchronised the device.
    REQUIRE(cuda_stub::Get().device_syncs >= released - 1);
  }
}

TEST_CASE("feedline-bench's consumer loop reads only host memory of device batches", "[cuda]") {
  // The stub's device addresses fault on the host as a GPU's do (--device cuda segfaulted on
  // its first batch when the checksum read the image field).
  FreshStub();
  auto loader = MakeLoader(Small().device("cuda:0"));
  feedline::bench::EpochRunOptions o;
  o.epochs = 2;
  o.progress = false;
  o.print_epochs = false;
  absl::StatusOr<feedline::bench::EpochRunResult> r = feedline::bench::RunEpochs(*loader, o);
  REQUIRE(r.ok());
  REQUIRE(r->epochs.size() == 2);
  REQUIRE(r->epochs[1].images == 39);
  REQUIRE(r->checksum != 0);
}

TEST_CASE("the last device batch, dropped after its loader, tears nothing down on its thread",
          "[cuda]") {
  // cudaFree synchronises the device: a training loop dropping the last batch of a loader that
  // is gone must not wait for it. The reaper thread frees the stage's buffers instead.
  FreshStub();
  std::vector<Batch> held;
  {
    auto loader = MakeLoader(Small().device("cuda:0"));
    for (absl::StatusOr<Batch>& b : *loader) {
      REQUIRE(b.ok());
      held.push_back(*b);
    }
  }
  REQUIRE(cuda_stub::Get().device_bytes_live > 0);  // the batches hold the stage
  std::thread dropper([&held] { held.clear(); });
  const std::thread::id id = dropper.get_id();
  dropper.join();
  RequireNothingLeft();
  REQUIRE_FALSE(cuda_stub::FreedOn(id));
}

namespace {

// Pixels from the index alone: 2 x 2 x 3 uint8, value (index * 12 + position) % 256.
class Pixels final : public feedline::Dataset {
 public:
  int64_t size() const override { return 10; }
  absl::Status Read(int64_t, feedline::Record* record) const override {
    record->Clear();
    return absl::OkStatus();
  }
  uint64_t Fingerprint() const override { return 10; }
  bool empty_records() const override { return true; }
};

// Writes the pixels into field 1 ("pixels") beside an int64 id (field 0), and asks the device
// for `conversion`.
class PixelTransform final : public feedline::SampleTransform {
 public:
  explicit PixelTransform(feedline::DeviceConversion conversion) : conversion_(conversion) {}
  const feedline::Schema& schema() const override { return schema_; }
  absl::Status Apply(const feedline::Record&, const feedline::SampleContext& ctx, WorkerState*,
                     feedline::SampleWriter& out) const override {
    *out.Fixed<int64_t>(0) = ctx.index();
    uint8_t* p = out.Fixed<uint8_t>(1);
    for (int i = 0; i < 12; ++i) p[i] = uint8_t(ctx.index() * 12 + i);
    return absl::OkStatus();
  }
  std::vector<feedline::DeviceConversion> DeviceConversions() const override {
    return {conversion_};
  }

 private:
  feedline::DeviceConversion conversion_;
  feedline::Schema schema_{feedline::Field("id", DType::kInt64, {}),
                           feedline::Field("pixels", DType::kUint8, {2, 2, 3})};
};

}  // namespace

TEST_CASE("a transform's declared conversion is made on the device; one it cannot be is refused",
          "[cuda]") {
  FreshStub();
  feedline::DeviceConversion c;
  c.field = 1;
  c.size = 2;
  c.dtype = DType::kFloat32;
  c.layout = Layout::kNCHW;
  c.mean = {0.0, 0.0, 0.0};
  c.std = {1.0, 1.0, 1.0};
  const LoaderOptions o = LoaderOptions().batch_size(4).shuffle(false).workers(1).device("cuda:0");
  {
    auto loader =
        Loader::Create(std::make_shared<Pixels>(), std::make_shared<PixelTransform>(c), o);
    INFO(loader.status().ToString());
    REQUIRE(loader.ok());
    int64_t seen = 0;
    for (absl::StatusOr<Batch>& b : **loader) {
      REQUIRE(b.ok());
      REQUIRE(b->set_consumer_stream(nullptr).ok());
      REQUIRE(cudaStreamSynchronize(nullptr) == cudaSuccess);
      const feedline::TensorView v = b->field("pixels");
      REQUIRE(v.device == 0);
      REQUIRE(v.dtype == DType::kFloat32);
      REQUIRE(v.shape == std::vector<int64_t>{b->size(), 3, 2, 2});  // CHW now
      std::vector<float> got(size_t(b->size() * 12));
      cuda_stub::CopyToHost(got.data(), v.data, got.size() * sizeof(float));
      for (int64_t s = 0; s < b->size(); ++s) {
        const int64_t index = b->indices()[s];
        for (int ch = 0; ch < 3; ++ch) {
          for (int px = 0; px < 4; ++px) {
            const float want = float(uint8_t(index * 12 + px * 3 + ch)) / 255.0f;
            REQUIRE(got[size_t(s * 12 + ch * 4 + px)] == Approx(want).margin(1e-6));
          }
        }
      }
      seen += b->size();
    }
    REQUIRE(seen == 10);
  }
  // The int64 id is no uint8 pixel field: refused when the loader is made, the field named.
  c.field = 0;
  auto bad = Loader::Create(std::make_shared<Pixels>(), std::make_shared<PixelTransform>(c), o);
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  REQUIRE_THAT(std::string(bad.status().message()), Catch::Matchers::Contains("\"id\""));
  c.field = 7;
  bad = Loader::Create(std::make_shared<Pixels>(), std::make_shared<PixelTransform>(c), o);
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  REQUIRE_THAT(std::string(bad.status().message()), Catch::Matchers::Contains("no such field"));
}
