// The loader (include/feedline/loader.h) over the engine: batches, stats, epochs, state, and
// BuildLoader, which turns EngineParts and options into a loader. The public factories that
// choose data sets, transforms and device stages are the wiring's (src/loaders/).
#include "feedline/loader.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <new>
#include <string>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/env.h"
#include "core/file_io.h"
#include "engine/bottleneck.h"
#include "engine/engine_parts.h"
#include "engine/epoch_run.h"
#include "engine/loader_shared.h"
#include "engine/simulated_latency.h"
#include "feedline/error.h"

namespace feedline {

// ---------------------------------------------------------------------------------------------
// Batch

namespace {
const Schema& EmptySchema() {
  static const Schema* empty = new Schema();
  return *empty;
}
}  // namespace

const Schema& Batch::schema() const noexcept {
  if (device_batch_) return device_batch_->layout->schema;
  return slot_ ? slot_->layout->schema : EmptySchema();
}

TensorView Batch::field(int i) const {
  TensorView v;
  const internal::SlotLayout* layout = device_batch_ ? device_batch_->layout.get()
                                       : slot_       ? slot_->layout
                                                     : nullptr;
  if (layout == nullptr || i < 0 || i >= layout->schema.size()) return v;
  const Field& f = layout->schema.field(i);
  const internal::Column& c =
      device_batch_ ? device_batch_->host_columns[size_t(i)] : slot_->columns[size_t(i)];
  internal::BatchSlot* host = device_batch_ ? device_batch_->host.get() : slot_.get();
  v.data = host != nullptr ? host->field_data(i) : nullptr;
  v.dtype = f.dtype();
  v.shape = c.shape;
  if (f.variable()) {
    v.lengths = c.lengths.data();
    v.sample_shapes = c.sample_shapes.data();
    if (f.collate() == Collate::kRagged) v.offsets = c.offsets.data();
  }
  if (device_batch_ && device_batch_->copy->columns[size_t(i)].data != nullptr) {
    const DeviceCopy::Column& d = device_batch_->copy->columns[size_t(i)];
    v.data = d.data;
    v.dtype = d.dtype;
    v.shape = d.shape;
    v.device = device_batch_->copy->device;
  }
  return v;
}

TensorView Batch::field(std::string_view name) const { return field(schema().Find(name)); }

const int64_t* Batch::indices() const noexcept {
  if (device_batch_) return device_batch_->indices.data();
  return slot_ ? slot_->indices.data() : nullptr;
}

std::array<int64_t, 4> Batch::image_shape() const {
  const TensorView v = field("image");
  if (v.shape.size() != 4) return {0, 0, 0, 0};
  return {v.shape[0], v.shape[1], v.shape[2], v.shape[3]};
}

void* Batch::ready_event() const noexcept {
  return device_batch_ ? device_batch_->copy->ready_event : nullptr;
}

absl::Status Batch::set_consumer_stream(void* cuda_stream) const {
  if (!device_batch_) return absl::OkStatus();
  return device_batch_->copy->UseOnStream(cuda_stream);
}

// ---------------------------------------------------------------------------------------------
// LoaderShared

void ErrorLog::Record(SampleError e) {
  count_.fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mu_);
  if (kept_.size() < kMaxKept) kept_.push_back(std::move(e));
}

std::string ErrorLog::FirstText() {
  std::lock_guard<std::mutex> lock(mu_);
  if (kept_.empty()) return "";
  return absl::StrCat(kept_.front().path, ": ", kept_.front().cause);
}

std::vector<SampleError> ErrorLog::Kept() {
  std::lock_guard<std::mutex> lock(mu_);
  return kept_;
}

Stats LoaderShared::Snapshot() {
  Stats s;
  const int64_t start = counters.start_ns.load();
  s.elapsed_s = start == 0 ? 0.0 : double(NowNs() - start) * 1e-9;
  s.samples = counters.samples.load();
  s.batches = counters.batches.load();
  s.samples_per_s = s.elapsed_s > 0 ? double(s.samples) / s.elapsed_s : 0.0;
  s.consumer_wait_s = double(counters.consumer.wait_ns.load()) * 1e-9;
  s.consumer_wait_fraction = s.elapsed_s > 0 ? std::min(1.0, s.consumer_wait_s / s.elapsed_s) : 0;
  s.epoch_start_wait_s =
      std::min(double(counters.epoch_start_wait_ns.load()) * 1e-9, s.consumer_wait_s);
  s.consumer_cpu_s = double(counters.consumer_cpu_ns.load()) * 1e-9;
  s.consumer_run_delay_s = double(counters.consumer_run_delay_ns.load()) * 1e-9;
  s.worker_nice = worker_nice;
  s.workers = tuning.workers.load();
  s.prefetch = tuning.prefetch.load();
  s.io_depth = tuning.io_depth.load();
  s.chunk = tuning.chunk.load();
  if (dataset != nullptr) s.remote = dataset->remote_stats();
  if (transform != nullptr) s.transform_counters = transform->Counters();
  auto stage = [](const char* name, const StageCounters& c, int threads) {
    StageStats st;
    st.name = name;
    st.busy_s = double(c.busy_ns.load()) * 1e-9;
    st.wait_s = double(c.wait_ns.load()) * 1e-9;
    st.items = c.items.load();
    st.threads = threads;
    st.occupancy = -1;
    return st;
  };
  s.stages.push_back(stage("read", counters.read, s.io_depth));
  // The map stage: the transform's time (the image built-in's decode, a tokenizer, user code).
  s.stages.push_back(stage("map", counters.map, s.workers));
  s.stages.push_back(stage("consumer", counters.consumer, 1));
  if (device_stage) {
    // GPU time of the copy engine and the conversion kernel, per batch (CUDA events).
    StageStats c;
    c.name = "copy";
    c.busy_s = device_stage->copy_ms() * 1e-3;
    c.items = device_stage->batches();
    c.threads = 1;
    s.stages.push_back(c);
  }
  if (const int64_t n = counters.fill_samples.load(); n > 0) {
    s.stages[0].occupancy = double(counters.read_fill_milli.load()) / 1000.0 / double(n);
    s.stages[1].occupancy = double(counters.ring_fill_milli.load()) / 1000.0 / double(n);
  }
  s.slots_allocated = memory.pool->allocated();
  s.slots_created = memory.pool->created();
  s.bytes_in_use = BytesInUse();
  s.memory_budget = options.memory_budget();
  s.auto_workers = tuning.auto_workers;
  s.auto_io_depth = tuning.auto_io_depth;
  s.auto_prefetch = tuning.auto_prefetch;
  {
    std::lock_guard<std::mutex> lock(tuner.mu);
    if (tuner.model) {
      s.demand_samples_per_s = tuner.model->demand_samples_per_s();
      s.map_ms_per_sample = tuner.model->map_s_per_sample() * 1e3;
      s.read_ms = tuner.model->read_s() * 1e3;
      s.trainer_cores = tuner.model->trainer_cores();
      s.cores_left_to_trainer = tuner.model->cores_left_to_trainer();
      s.trainer_reason = tuner.model->trainer_reason();
      for (const TunerDecision& d : tuner.model->decisions()) {
        s.tuning.push_back(TuningEvent{d.time_s, d.settings.workers, d.settings.io_depth,
                                       d.settings.prefetch, d.samples_per_s, d.reason});
      }
    }
    s.timeline = tuner.timeline;
  }
  if (s.map_ms_per_sample == 0 && counters.map.items.load() > 0) {
    s.map_ms_per_sample =
        double(counters.map.busy_ns.load()) * 1e-6 / double(counters.map.items.load());
  }
  if (s.read_ms == 0 && counters.read.items.load() > 0) {
    s.read_ms = double(counters.read.busy_ns.load()) * 1e-6 / double(counters.read.items.load());
  }
  s.cache = options.cache() == Cache::kBytes     ? "bytes"
            : options.cache() == Cache::kDecoded ? "decoded"
                                                 : "none";
  if (memory.cache) {
    s.cache_hits = memory.cache->hits();
    s.cache_misses = memory.cache->misses();
    s.cache_bytes = memory.cache->bytes();
    s.cache_budget = memory.cache->budget();
  }
  s.error_count = errors.count();
  s.errors = errors.Kept();
  DiagnoseBottleneck(&s);
  return s;
}

// ---------------------------------------------------------------------------------------------
// Epoch

namespace {
// Runs being destroyed by threads of their own (Abandon). At exit the process waits a bounded
// time for them: a reaper still joining its run's threads while static destructors and the
// sanitizers' exit checks run is a thread touching a process being taken down. Not a mutex: a
// fork may copy it held; the child has no reapers, and its handler says so.
std::atomic<int> g_reapers{0};

void WaitForReapersAtExit() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (g_reapers.load(std::memory_order_acquire) > 0 && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
}

void CountReaper() {
  static const bool registered = [] {
    std::atexit(&WaitForReapersAtExit);
    pthread_atfork(nullptr, nullptr, [] { g_reapers.store(0, std::memory_order_relaxed); });
    return true;
  }();
  (void)registered;
  g_reapers.fetch_add(1, std::memory_order_acq_rel);
}

// Ends a run that nobody will iterate any more (a dropped Epoch, a head start not adopted).
void Abandon(std::unique_ptr<EpochRun> owned) {
  if (owned == nullptr) return;
  if (owned->forked()) {
    (void)owned.release();  // deliberately leaked: see forked()
    return;
  }
  // The run is destroyed by a thread of its own, once its workers have returned, when
  //  - it is dropped by user code on one of its own threads (a Python garbage collection in a
  //    data set's __getitem__ freeing an abandoned iterator): joining the threads here would
  //    join this one;
  //  - a worker is stuck in user code that does not return (a hung __getitem__ after the loop
  //    gave up on it: DataLoader(timeout=)): it must not hang the one dropping the epoch, nor
  //    the process at exit.
  const bool own_thread = owned->on_own_thread();
  owned->Cancel();
  // Otherwise the run is destroyed here, on this thread.
  if (!own_thread && owned->WorkersDone(std::chrono::milliseconds(500))) return;
  EpochRun* run = owned.release();
  try {
    CountReaper();
    std::thread([run] {
      delete run;
      g_reapers.fetch_sub(1, std::memory_order_acq_rel);
    }).detach();
  } catch (const std::system_error&) {
    g_reapers.fetch_sub(1, std::memory_order_acq_rel);
    // No thread to be had: wait here after all, unless that would join this thread (the
    // cancelled run is then leaked rather than the process ended).
    if (!own_thread) delete run;
  }
}
}  // namespace

Epoch::Epoch(std::unique_ptr<EpochRun> run) : run_(std::move(run)) {}
Epoch::~Epoch() { Abandon(std::move(run_)); }
absl::StatusOr<Batch> Epoch::Next() { return run_->Next(); }
absl::StatusOr<Batch> Epoch::Next(const std::function<absl::Status()>& interrupted,
                                  absl::Duration poll) {
  return run_->Next(interrupted, poll);
}
int64_t Epoch::epoch() const noexcept { return run_->epoch(); }
int64_t Epoch::num_batches() const noexcept { return run_->num_batches(); }
void Epoch::Cancel() { run_->Cancel(); }

// ---------------------------------------------------------------------------------------------
// Loader

namespace {

// The engine's options (their ranges from their declarations), and what depends on another.
absl::Status Validate(const LoaderOptions& o) {
  if (absl::Status s = ValidateOptions(o, OptionGroup::kEngine); !s.ok()) return s;
  if (o.rank() < 0 || o.rank() >= o.world_size())
    return InvalidOption("rank", absl::StrCat("must be in [0, world_size=", o.world_size(), ")"));
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::StatusOr<std::unique_ptr<Loader>> BuildLoader(EngineParts parts, LoaderOptions options) {
  if (absl::Status s = Validate(options); !s.ok()) return s;
  if (parts.dataset == nullptr) return InvalidOption("dataset", "must not be null");
  if (parts.transform == nullptr) return InvalidOption("transform", "must not be null");
  if (parts.dataset->size() < 1) return InvalidOption("dataset", "has no samples");
  const Schema& schema = parts.transform->schema();
  if (absl::Status s = schema.Validate(); !s.ok()) return s;
  auto shared = std::make_shared<LoaderShared>();
  shared->user_dataset = parts.dataset;
  shared->dataset = parts.dataset;
  shared->transform = std::move(parts.transform);
  shared->dataset_fingerprint = parts.dataset->Fingerprint();
  if (options.simulated_read_latency_ms() > 0) {  // whatever the data set
    shared->dataset = std::make_shared<SimulatedLatencyDataset>(
        std::move(parts.dataset), options.simulated_read_latency_ms());
  }
  shared->inline_reads = shared->dataset->empty_records() || shared->dataset->in_memory();
  if (shared->transform->WholeBatches()) {
    shared->tuning.whole_batches = true;
    shared->tuning.chunk.store(int(std::min<int64_t>(options.batch_size(), int64_t{1} << 30)));
  }
  shared->layout =
      std::make_shared<const SlotLayout>(SlotLayout::Make(schema, options.batch_size()));
  shared->device = parts.device.device;
  HostAllocator* allocator =
      parts.device.allocator ? parts.device.allocator : DefaultHostAllocator();
  if (parts.device.device >= 0) {
    if (!parts.device.make_stage) {
      return absl::FailedPreconditionError("device: this loader has no device stage");
    }
    absl::StatusOr<std::unique_ptr<DeviceStage>> stage =
        parts.device.make_stage(StageSpec(*shared->layout, shared->transform->DeviceConversions()));
    if (!stage.ok()) return stage.status();
    shared->device_stage = *std::move(stage);
  }
  shared->memory.pool = std::make_shared<SlotPool>(allocator, shared->layout);
  if (DeviceStage* stage = shared->device_stage.get()) {
    // Slots whose copies are done come back before the ring allocates another (the stage is
    // destroyed after the threads that acquire slots have stopped).
    shared->memory.pool->set_reclaim([stage](int64_t wait_ns) { stage->ReturnCopied(wait_ns); });
  }

  // Resolve "auto" once. Transforms are CPU-bound: one worker per core. Reads of local files
  // are short; a few in flight hide their latency. The ring holds enough batches to absorb
  // jitter, within the budget.
  const int cores = std::max(1u, std::thread::hardware_concurrency());
  const int64_t budget =
      options.memory_budget() > 0 ? options.memory_budget() : AvailableMemoryBytes() / 4;
  const int64_t slot_bytes = int64_t(shared->memory.pool->slot_bytes());
  // Auto settings start where local, CPU-bound data needs them; the autotuner moves them.
  const int workers = options.workers() > 0 ? options.workers() : cores;
  const int io_depth = options.io_depth() > 0 ? options.io_depth() : 2;
  const int64_t read_bytes = int64_t(io_depth + 2 * workers) * parts.read_bytes_hint;
  const int64_t fit = (budget - read_bytes) / slot_bytes;
  int prefetch = options.prefetch();
  if (prefetch > 0) {
    if (prefetch > fit) {
      return absl::ResourceExhaustedError(
          absl::StrCat("prefetch=", prefetch, " batches of ", slot_bytes, " bytes (+", read_bytes,
                       " bytes of reads in flight) do not fit memory_budget=", budget,
                       " bytes; lower prefetch or batch_size, or raise memory_budget"));
    }
  } else {
    if (fit < 1) {
      return absl::ResourceExhaustedError(
          absl::StrCat("one batch of ", slot_bytes, " bytes does not fit memory_budget=", budget,
                       " bytes; lower batch_size or the sample size, or raise memory_budget"));
    }
    prefetch = int(std::clamp<int64_t>(fit, 1, 2));
  }
  shared->tuning.auto_workers = options.workers() == kAuto;
  shared->tuning.auto_io_depth = options.io_depth() == kAuto;
  shared->tuning.auto_prefetch = options.prefetch() == kAuto;
  shared->cores = cores;
  shared->memory.budget = budget;
  absl::StatusOr<int> nice = ResolvedWorkerNice(options);
  if (!nice.ok()) return nice.status();
  options.worker_nice(*nice);
  if (const std::string env = Env("FEEDLINE_EPOCH_HEAD_START"); !env.empty()) {
    if (env != "0" && env != "1") {
      return InvalidOption("epoch_head_start",
                           absl::StrCat("FEEDLINE_EPOCH_HEAD_START=", env, " must be 0 or 1"));
    }
    // 0 turns it off; 1 leaves it as the face chose (feedline.DataLoader cannot have one).
    if (env == "0") options.epoch_head_start(false);
  }
  if (!shared->transform->MayStartAhead()) options.epoch_head_start(false);
  shared->worker_nice = shared->transform->SharesConsumerLocks() ? 0 : options.worker_nice();
  if (options.cache() != Cache::kNone) {
    // The cache gets what the budget leaves after the ring (at its largest) and the reads.
    const int64_t left =
        budget - read_bytes - std::min<int64_t>(fit, MemoryBudget::kMaxAutoPrefetch) * slot_bytes;
    int64_t cache_budget = options.cache_budget();
    if (cache_budget > 0 && cache_budget > budget - read_bytes - int64_t(prefetch) * slot_bytes) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "cache_budget=", cache_budget, " bytes does not fit memory_budget=", budget,
          " bytes next to the prefetch ring; lower cache_budget or raise memory_budget"));
    }
    if (cache_budget == 0) cache_budget = std::max<int64_t>(left, 0);
    if (cache_budget <= 0) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no room for a cache in memory_budget=", budget, " bytes; raise memory_budget"));
    }
    options.cache_budget(cache_budget);
    shared->memory.cache =
        std::make_shared<SampleCache>(shared->dataset->num_records(), cache_budget);
    shared->memory.cache_holds_bytes = parts.cache_holds_bytes;
    if (!parts.cache_holds_bytes) {
      if (!parts.attach_cache)
        return InvalidOption("cache", "this loader's transform has no cache");
      parts.attach_cache(shared->memory.cache);
    }
  }
  if (shared->tuning.auto_workers || shared->tuning.auto_io_depth || shared->tuning.auto_prefetch) {
    TunerLimits limits;
    limits.max_workers = std::max(cores, workers);
    limits.max_io_depth = 256;
    limits.max_prefetch = shared->memory.AutoPrefetchLimit(read_bytes);  // after the cache's share
    limits.tune_workers = shared->tuning.auto_workers;
    limits.tune_io_depth = shared->tuning.auto_io_depth;
    limits.tune_prefetch = shared->tuning.auto_prefetch;
    std::lock_guard<std::mutex> lock(shared->tuner.mu);
    shared->tuner.model =
        std::make_unique<Autotuner>(limits, TunerSettings{workers, io_depth, prefetch});
  }
  shared->trace = std::make_unique<TraceRecorder>(NowNs());
  options.workers(workers).io_depth(io_depth).prefetch(prefetch).memory_budget(budget);
  shared->tuning.workers.store(workers);
  shared->tuning.io_depth.store(io_depth);
  shared->tuning.prefetch.store(prefetch);
  shared->memory.read_bytes_reserved = read_bytes;
  shared->memory.KeepSlots(prefetch);
  if (shared->device >= 0) {
    // Pinned memory is allocated now: cudaHostAlloc synchronises with the device.
    try {
      shared->memory.pool->Reserve();
    } catch (const std::bad_alloc&) {
      return MarkDeviceError(absl::ResourceExhaustedError(absl::StrCat(
          "device: cannot allocate pinned host memory for the prefetch ring (", prefetch,
          " batches of ", slot_bytes, " bytes); lower batch_size or prefetch")));
    }
  }

  shared->sampler.dataset_size = shared->dataset->size();
  shared->sampler.batch_size = options.batch_size();
  shared->sampler.shuffle = options.shuffle();
  shared->sampler.seed = options.seed();
  shared->sampler.drop_last = options.drop_last();
  shared->sampler.rank = options.rank();
  shared->sampler.world_size = options.world_size();
  shared->sampler.even_shards = options.even_shards();
  shared->options = std::move(options);
  return std::unique_ptr<Loader>(new Loader(std::move(shared)));
}

}  // namespace internal

Loader::Loader(std::shared_ptr<LoaderShared> shared) : shared_(std::move(shared)) {}

namespace {
// Drops a head start taken out of LoaderShared (outside epochs.mu: its destructor takes it), as
// an abandoned epoch is dropped (~Epoch: not joined on its own threads, nor when stuck).
void Drop(std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> run) {
  Abandon(std::unique_ptr<EpochRun>(run.release()));
}
}  // namespace

Loader::~Loader() {
  // In a child of fork(), the active run (and the mutex) may belong to the parent's threads.
  EpochRun* run = shared_->epochs.active;
  if (run != nullptr && run->forked()) return;
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> head_start;
  {
    std::lock_guard<std::mutex> lock(shared_->epochs.mu);
    if (shared_->epochs.active != nullptr) shared_->epochs.active->Cancel();
    shared_->epochs.loader_gone = true;
    head_start = std::move(shared_->epochs.head_start);  // it holds shared_: the cycle ends here
  }
  Drop(std::move(head_start));
}

std::unique_ptr<Epoch> Loader::StartEpoch() {
  int64_t epoch, start, skip;
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> head_start;
  std::unique_ptr<EpochRun> adopted;
  {
    std::lock_guard<std::mutex> lock(shared_->epochs.mu);
    if (shared_->epochs.active != nullptr) shared_->epochs.active->Cancel();
    epoch = shared_->epochs.next_epoch++;
    start = shared_->epochs.next_start_batch;
    skip = shared_->epochs.next_skip;
    shared_->epochs.next_start_batch = 0;
    shared_->epochs.next_skip = 0;
    shared_->epochs.has_partial = false;
    head_start = std::move(shared_->epochs.head_start);
    if (head_start != nullptr && head_start->epoch() == epoch && start == 0 && skip == 0) {
      adopted.reset(head_start.release());
      adopted->Adopt();
      shared_->epochs.active = adopted.get();
    }
  }
  Drop(std::move(head_start));  // another epoch was asked for
  if (adopted != nullptr) return std::unique_ptr<Epoch>(new Epoch(std::move(adopted)));
  return std::unique_ptr<Epoch>(
      new Epoch(std::make_unique<EpochRun>(shared_, epoch, start, /*head_start=*/false, skip)));
}

namespace {

// A run of some of `epoch`'s batches (StartBatches, StartFromFeed) is refused for the epoch a
// state saved on another layout resumes: its order starts past the positions delivered there.
absl::Status ResumedElsewhere(LoaderShared& sh, int64_t epoch) {
  std::lock_guard<std::mutex> lock(sh.epochs.mu);
  if (sh.epochs.next_skip != 0 && sh.epochs.next_epoch == epoch) {
    return absl::InvalidArgumentError(
        absl::StrCat("epoch ", epoch,
                     " resumes a state saved on another layout: its batches are made "
                     "where it is iterated"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Epoch>> Loader::StartBatches(int64_t epoch,
                                                            std::vector<int64_t> batches) {
  const int64_t n = num_batches();
  if (epoch < 0) return absl::InvalidArgumentError(absl::StrCat("epoch ", epoch, " < 0"));
  if (batches.empty()) return absl::InvalidArgumentError("no batches to make");
  for (size_t i = 0; i < batches.size(); ++i) {
    if (batches[i] < 0 || batches[i] >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch ", batches[i], " is not one of the epoch's ", n, " batches"));
    }
    if (i > 0 && batches[i] <= batches[i - 1]) {
      return absl::InvalidArgumentError(
          absl::StrCat("batches must ascend: ", batches[i - 1], " then ", batches[i]));
    }
  }
  if (absl::Status st = ResumedElsewhere(*shared_, epoch); !st.ok()) return st;
  return std::unique_ptr<Epoch>(new Epoch(std::make_unique<EpochRun>(
      shared_, epoch, /*start_batch=*/0, /*head_start=*/false, /*skip=*/0, std::move(batches))));
}

absl::StatusOr<std::unique_ptr<Epoch>> Loader::StartFromFeed(int64_t epoch,
                                                             std::shared_ptr<BatchFeed> feed) {
  if (feed == nullptr) return absl::InvalidArgumentError("no feed");
  if (epoch < 0) return absl::InvalidArgumentError(absl::StrCat("epoch ", epoch, " < 0"));
  const int64_t full = num_samples() / shared_->options.batch_size();
  if (feed->first() < 0 || feed->end() > full || feed->first() >= feed->end()) {
    return absl::InvalidArgumentError(absl::StrCat("a feed of batches [", feed->first(), ", ",
                                                   feed->end(), ") is not within the epoch's ",
                                                   full, " full batches"));
  }
  if (absl::Status st = ResumedElsewhere(*shared_, epoch); !st.ok()) return st;
  return std::unique_ptr<Epoch>(
      new Epoch(std::make_unique<EpochRun>(shared_, epoch, /*start_batch=*/0, /*head_start=*/false,
                                           /*skip=*/0, std::vector<int64_t>{}, std::move(feed))));
}

BatchFeed::BatchFeed(int64_t first, int64_t end)
    : first_(first),
      end_(std::max(first, end)),
      next_(first),
      owners_(size_t(std::max<int64_t>(0, end - first)), kNone) {}

int64_t BatchFeed::Claim(Owner who, int64_t lead) {
  std::lock_guard<std::mutex> lock(mu_);
  auto free = [&](int64_t b) { return owners_[size_t(b - first_)] == kNone; };
  while (next_ < end_ && !free(next_)) ++next_;
  if (closed_ || next_ >= end_) return -1;
  int64_t b = next_;
  if (lead > 0) {
    const int64_t from = std::min(end_ - 1, next_ + lead);
    b = -1;
    for (int64_t k = from; k < end_ && b < 0; ++k) {
      if (free(k)) b = k;
    }
    for (int64_t k = from - 1; k >= next_ && b < 0; --k) {
      if (free(k)) b = k;
    }
  }
  owners_[size_t(b - first_)] = int8_t(who);
  ++claimed_;
  return b;
}

bool BatchFeed::Take(int64_t b, Owner who) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || b < first_ || b >= end_ || owners_[size_t(b - first_)] != kNone) return false;
  owners_[size_t(b - first_)] = int8_t(who);
  ++claimed_;
  return true;
}

int64_t BatchFeed::unclaimed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ ? 0 : end_ - first_ - claimed_;
}

BatchFeed::Owner BatchFeed::owner(int64_t b) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (b < first_ || b >= end_) return kNone;
  return Owner(owners_[size_t(b - first_)]);
}

void BatchFeed::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

int64_t Loader::num_batches() const noexcept { return BatchesPerRank(shared_->sampler); }
int64_t Loader::num_samples() const noexcept {
  const int64_t s = SamplesPerRank(shared_->sampler);
  return shared_->sampler.drop_last ? s / shared_->sampler.batch_size * shared_->sampler.batch_size
                                    : s;
}
const Dataset& Loader::dataset() const noexcept { return *shared_->user_dataset; }
const Schema& Loader::schema() const noexcept { return shared_->layout->schema; }
const LoaderOptions& Loader::options() const noexcept { return shared_->options; }

void Loader::set_epoch(int64_t epoch) {
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> head_start;
  {
    std::lock_guard<std::mutex> lock(shared_->epochs.mu);
    shared_->epochs.next_epoch = epoch;
    shared_->epochs.next_start_batch = 0;
    shared_->epochs.next_skip = 0;
    shared_->epochs.has_partial = false;
    // Kept when it is this epoch (set_epoch(e) before each epoch, as with DistributedSampler).
    if (shared_->epochs.head_start != nullptr && shared_->epochs.head_start->epoch() != epoch) {
      head_start = std::move(shared_->epochs.head_start);
    }
  }
  Drop(std::move(head_start));
}

Loader::State Loader::state() const {
  State s;
  const LoaderOptions& o = shared_->options;
  s.seed = o.seed();
  s.rank = o.rank();
  s.world_size = o.world_size();
  s.batch_size = o.batch_size();
  s.shuffle = o.shuffle();
  s.drop_last = o.drop_last();
  s.dataset_size = shared_->dataset->size();
  s.dataset_fingerprint = shared_->dataset_fingerprint;
  std::lock_guard<std::mutex> lock(shared_->epochs.mu);
  EpochRun* run = shared_->epochs.active;
  if (run != nullptr && run->consumed() < run->num_batches()) {
    s.epoch = run->epoch();
    s.batches_done = run->consumed();
    s.skipped = run->skip();
  } else if (shared_->epochs.has_partial) {  // an epoch stopped early (the loop broke out)
    s.epoch = shared_->epochs.partial_epoch;
    s.batches_done = shared_->epochs.partial_batches;
    s.skipped = shared_->epochs.partial_skip;
  } else {
    s.epoch = shared_->epochs.next_epoch;
    s.batches_done = shared_->epochs.next_start_batch;
    s.skipped = shared_->epochs.next_skip;
  }
  return s;
}

absl::Status Loader::LoadState(const State& st, bool resplit) {
  const State mine = state();
  auto mismatch = [](absl::string_view what, auto saved, auto here) {
    return absl::InvalidArgumentError(absl::StrCat("state_dict: made for ", what, "=", saved,
                                                   " but this loader has ", what, "=", here));
  };
  if (st.dataset_size != mine.dataset_size || st.dataset_fingerprint != mine.dataset_fingerprint) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state_dict: made for another data set (", st.dataset_size, " samples, fingerprint ",
        absl::Hex(st.dataset_fingerprint), "; this one: ", mine.dataset_size, " samples, ",
        absl::Hex(mine.dataset_fingerprint), ")"));
  }
  if (st.seed != mine.seed) return mismatch("seed", st.seed, mine.seed);
  if (st.shuffle != mine.shuffle) return mismatch("shuffle", st.shuffle, mine.shuffle);
  if (st.drop_last != mine.drop_last) return mismatch("drop_last", st.drop_last, mine.drop_last);
  // Every field is checked before it is used: a state is a file a user (or anyone who can
  // write the checkpoint) hands in.
  auto bad = [](absl::string_view field, int64_t value, absl::string_view want) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_dict: ", field, " must be ", want, " (got ", value, ")"));
  };
  if (st.epoch < 0) return bad("epoch", st.epoch, ">= 0");
  if (st.batches_done < 0) return bad("batches_done", st.batches_done, ">= 0");
  if (st.batch_size < 1) return bad("batch_size", st.batch_size, ">= 1");
  if (st.world_size < 1) return bad("world_size", st.world_size, ">= 1");
  if (st.rank < 0 || st.rank >= st.world_size) {
    return bad("rank", st.rank, absl::StrCat("in [0, world_size=", st.world_size, ")"));
  }
  if (st.skipped < 0 || st.skipped > st.dataset_size) {
    return bad("skipped", st.skipped, absl::StrCat("in [0, dataset_size=", st.dataset_size, "]"));
  }
  // The batches one rank has in an epoch of the saved layout (after what it skipped).
  SamplerConfig saved = shared_->sampler;
  saved.dataset_size = st.dataset_size;
  saved.batch_size = st.batch_size;
  saved.world_size = st.world_size;
  saved.rank = st.rank;
  const int64_t max_batches = BatchesPerRank(AfterSkip(saved, st.skipped));
  if (st.batches_done > max_batches) {
    return bad("batches_done", st.batches_done,
               absl::StrCat("at most ", max_batches, " (the batches of an epoch of ",
                            st.dataset_size - st.skipped, " samples at batch_size=", st.batch_size,
                            ", world_size=", st.world_size, ")"));
  }
  int64_t epoch = st.epoch, start = st.batches_done, skip = st.skipped;
  if (st.world_size != mine.world_size || st.batch_size != mine.batch_size) {
    if (!resplit) {
      return st.world_size != mine.world_size
                 ? absl::InvalidArgumentError(
                       absl::StrCat("state_dict: made for world_size=", st.world_size,
                                    " but this loader has "
                                    "world_size=",
                                    mine.world_size,
                                    "; pass resplit=True to carry the position "
                                    "over to the new layout"))
                 : mismatch("batch_size", st.batch_size, mine.batch_size);
    }
    // What the old layout's ranks delivered is a prefix of the epoch's order (EpochOrder): its
    // length, in 128 bits (a saved batch_size near 2^63 makes one batch the whole epoch). This
    // layout's ranks deliver the rest, each sample once; the next epochs are this layout's own.
    const __int128 seen = std::min<__int128>(
        __int128(st.batches_done) * st.batch_size * st.world_size, st.dataset_size - st.skipped);
    skip = st.skipped + int64_t(seen);
    start = 0;
    if (skip >= st.dataset_size && epoch < std::numeric_limits<int64_t>::max()) {
      ++epoch;  // the epoch was delivered whole
      skip = 0;
    }
  } else if (st.rank != mine.rank && !resplit) {
    return mismatch("rank", st.rank, mine.rank);
  }
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> head_start;
  {
    std::lock_guard<std::mutex> lock(shared_->epochs.mu);
    shared_->epochs.next_epoch = epoch;
    shared_->epochs.next_start_batch =
        std::min(start, BatchesPerRank(AfterSkip(shared_->sampler, skip)));
    shared_->epochs.next_skip = skip;
    shared_->epochs.has_partial = false;
    if (shared_->epochs.head_start != nullptr &&
        (shared_->epochs.head_start->epoch() != epoch || shared_->epochs.next_start_batch != 0 ||
         skip != 0)) {
      head_start = std::move(shared_->epochs.head_start);
    }
  }
  Drop(std::move(head_start));
  return absl::OkStatus();
}
void Loader::DropAhead() {
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> head_start;
  {
    std::lock_guard<std::mutex> lock(shared_->epochs.mu);
    head_start = std::move(shared_->epochs.head_start);
  }
  Drop(std::move(head_start));
}

bool Loader::StartAhead(int64_t epoch) {
  LoaderShared& sh = *shared_;
  auto wanted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.epochs.mu) {
    return !sh.epochs.loader_gone && sh.epochs.head_start == nullptr &&
           sh.epochs.active == nullptr && sh.epochs.next_epoch == epoch &&
           sh.epochs.next_start_batch == 0 && sh.epochs.next_skip == 0;
  };
  if (!sh.options.epoch_head_start() || epoch < 0) return false;
  {
    std::lock_guard<std::mutex> lock(sh.epochs.mu);
    if (!wanted()) return false;
  }
  if (!sh.transform->MayStartEpoch(epoch)) return false;
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> run(
      new EpochRun(shared_, epoch, 0, /*head_start=*/true));
  {
    std::lock_guard<std::mutex> lock(sh.epochs.mu);
    if (wanted()) {
      sh.epochs.head_start = std::move(run);
      return true;
    }
  }
  Drop(std::move(run));  // an epoch was started meanwhile
  return false;
}

int64_t Loader::next_epoch() const noexcept {
  std::lock_guard<std::mutex> lock(shared_->epochs.mu);
  return shared_->epochs.next_epoch;
}

Stats Loader::stats() const { return shared_->Snapshot(); }
absl::Status Loader::SaveTrace(const std::string& path) const { return shared_->trace->Save(path); }

namespace {
// A setting the user fixes is no longer the tuner's.
void FixSetting(LoaderShared& shared, Autotuner::Knob knob, int value) {
  std::lock_guard<std::mutex> lock(shared.tuner.mu);
  switch (knob) {
    case Autotuner::Knob::kWorkers:
      shared.tuning.auto_workers = false;
      break;
    case Autotuner::Knob::kIoDepth:
      shared.tuning.auto_io_depth = false;
      break;
    case Autotuner::Knob::kPrefetch:
      shared.tuning.auto_prefetch = false;
      break;
  }
  if (shared.tuner.model) shared.tuner.model->Fix(knob, value);
}
}  // namespace

void Loader::set_workers(int n) {
  FixSetting(*shared_, Autotuner::Knob::kWorkers, std::max(1, n));
  std::lock_guard<std::mutex> lock(shared_->epochs.mu);
  if (shared_->epochs.active != nullptr) {
    shared_->epochs.active->SetWorkers(n);
  } else {
    shared_->tuning.workers.store(std::max(1, n));
  }
}
void Loader::set_prefetch(int n) {
  FixSetting(*shared_, Autotuner::Knob::kPrefetch, std::clamp(n, 1, kMaxPrefetch));
  std::lock_guard<std::mutex> lock(shared_->epochs.mu);
  if (shared_->epochs.active != nullptr) {
    shared_->epochs.active->SetPrefetch(n);
  } else {
    n = std::clamp(n, 1, kMaxPrefetch);
    shared_->tuning.prefetch.store(n);
    shared_->memory.KeepSlots(n);
  }
}
void Loader::set_io_depth(int n) {
  FixSetting(*shared_, Autotuner::Knob::kIoDepth, std::max(1, n));
  std::lock_guard<std::mutex> lock(shared_->epochs.mu);
  if (shared_->epochs.active != nullptr) {
    shared_->epochs.active->SetIoDepth(n);
  } else {
    shared_->tuning.io_depth.store(std::max(1, n));
  }
}

Loader::Iterator::Iterator(std::shared_ptr<Epoch> epoch) : epoch_(std::move(epoch)), done_(false) {
  ++*this;
}

Loader::Iterator& Loader::Iterator::operator++() {
  current_ = epoch_->Next();
  if (absl::IsOutOfRange(current_.status()) || absl::IsCancelled(current_.status())) {
    done_ = true;
    epoch_.reset();
  }
  return *this;
}

Loader::Iterator Loader::begin() { return Iterator(std::shared_ptr<Epoch>(StartEpoch())); }

}  // namespace feedline
