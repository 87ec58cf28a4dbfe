#include "pipeline/epoch_run.h"

#include <pthread.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "decode/image_decoder.h"
#include "image/convert.h"
#include "image/random.h"
#include "image/transform.h"
#include "pipeline/handoff_queue.h"

namespace feedline {

struct EpochRun::ReadItem {
  int64_t seq = 0;
  int64_t sample = 0;
  int attempt = 0;  // replacements tried for this position (on_error = skip)
  std::shared_ptr<const SampleCache::Entry> decoded;  // cache = decoded: a hit, read skipped
  absl::Status status;
  std::vector<uint8_t> bytes;
};

// A batch in flight: its slot and how many of its samples are still to be written.
struct EpochRun::InFlight {
  std::atomic<int64_t> batch{-1};  // published (release) after the fields below are set
  std::atomic<int64_t> remaining{0};
  std::shared_ptr<internal::BatchSlot> slot;
  int64_t count = 0;
  int64_t open_ns = 0;
  std::mutex mu;  // guards the error (rare path)
  absl::Status error ABSL_GUARDED_BY(mu);
  int64_t error_pos ABSL_GUARDED_BY(mu) = -1;
};

// Readers hand filled buffers to decoders through `ready`; decoders hand them back through
// `free`. Both are unbounded (never block on push): the number of buffers bounds them. A null
// item is the stop sentinel (pushed once per thread on cancel).
struct EpochRun::Queues {
  HandoffQueue<ReadItem*> ready;
  HandoffQueue<ReadItem*> free;
  HandoffQueue<ReadItem*> retry;  // decoders -> the retry reader
  std::mutex mu;
  std::vector<std::unique_ptr<ReadItem>> all ABSL_GUARDED_BY(mu);
};

// One reader thread's state, shared with the watchdog (the tuner thread). A read that outlives
// the timeout is abandoned: the watchdog fails its sample and starts a replacement thread; the
// stuck thread, when (if) its read returns, sees the abandonment and exits, touching nothing
// but this record and the loader's shared state, both of which it keeps alive.
struct EpochRun::ReaderState {
  enum : int { kIdle = 0, kReading = 1, kAbandoned = 2 };
  std::atomic<int> phase{kIdle};
  std::atomic<int64_t> started_ns{0};
  ReadItem* item = nullptr;     // the item being read (published by the phase store)
  std::vector<uint8_t> buffer;  // reads land here, then move into the item
};

namespace {
// Bumped in the child after fork(): threads started before it do not exist there.
std::atomic<uint64_t> g_fork_generation{0};
void OnForkChild() { g_fork_generation.fetch_add(1, std::memory_order_relaxed); }
uint64_t ForkGeneration() {
  static const bool registered = [] {
    return pthread_atfork(nullptr, nullptr, &OnForkChild) == 0;
  }();
  (void)registered;
  return g_fork_generation.load(std::memory_order_relaxed);
}
}  // namespace

struct EpochRun::DecoderState {
  ImageDecoder decoder;
  ResampleScratch scratch;
  std::vector<uint8_t> u8;  // one uint8 sample, before conversion to a float dtype
};

EpochRun::EpochRun(std::shared_ptr<LoaderShared> shared, int64_t epoch, int64_t start_batch)
    : shared_(std::move(shared)),
      epoch_(epoch),
      order_(EpochOrder(shared_->sampler, epoch)),
      batch_size_(shared_->options.batch_size()),
      num_batches_(BatchesPerRank(shared_->sampler)),
      total_seq_(static_cast<int64_t>(order_.size())),
      next_seq_(std::min(start_batch * batch_size_, total_seq_)),
      consumed_(std::min(start_batch, num_batches_)),
      opened_(std::min(start_batch, num_batches_)),
      inflight_(new InFlight[kMaxPrefetch]),
      queues_(std::make_unique<Queues>()),
      fork_generation_(ForkGeneration()) {
  int64_t expected = 0;
  shared_->start_ns.compare_exchange_strong(expected, NowNs());
  {
    std::lock_guard<std::mutex> lock(shared_->active_mu);
    shared_->active = this;
  }
  last_return_ns_ = NowNs();
  StartThreads();
}

EpochRun::~EpochRun() {
  Shutdown();
  std::lock_guard<std::mutex> lock(shared_->active_mu);
  if (shared_->active == this) {
    shared_->active = nullptr;
    const int64_t done = consumed_.load();
    if (done < num_batches_) {
      shared_->has_partial = true;
      shared_->partial_epoch = epoch_;
      shared_->partial_batches = done;
    }
  }
}

bool EpochRun::forked() const { return fork_generation_ != ForkGeneration(); }

void EpochRun::StartThreads() {
  consumer_track_ = shared_->trace->Track("consumer");
  batch_track_ = shared_->trace->Track("batches (open -> handed out)");
  SetIoDepth(shared_->io_depth.load());
  SetWorkers(shared_->workers.load());
  std::lock_guard<std::mutex> lock(threads_mu_);
  tuner_thread_ = std::thread([this] { TunerLoop(); });
}

void EpochRun::TunerLoop() {
  constexpr auto kInterval = std::chrono::milliseconds(200);
  int64_t last = NowNs();
  last_tick_ = ReadCounters();
  while (true) {
    {
      std::unique_lock<std::mutex> lock(tuner_mu_);
      tuner_cv_.wait_for(lock, kInterval, [this] { return cancelled_.load(); });
    }
    if (cancelled_.load()) return;
    const int64_t now = NowNs();
    if (const double timeout_ms = shared_->options.read_timeout_ms(); timeout_ms > 0) {
      AbandonStuckReads(now - int64_t(timeout_ms * 1e6),
                        absl::StrFormat("read_timeout_ms=%g", timeout_ms).c_str());
    }
    TunerTick(double(now - last) * 1e-9);
    last = now;
  }
}

EpochRun::Counters EpochRun::ReadCounters() const {
  const LoaderShared& sh = *shared_;
  return Counters{.images = sh.images.load(),
                  .consumer_busy = sh.consumer.busy_ns.load(),
                  .stepped_images = sh.stepped_images.load(),
                  .consumer_wait = sh.consumer.wait_ns.load(),
                  .steady_wait = sh.steady_wait_ns.load(),
                  .decoded = sh.decode.items.load(),
                  .decode_busy = sh.decode.busy_ns.load(),
                  .reads = sh.read.items.load(),
                  .read_busy = sh.read.busy_ns.load(),
                  .decode_cpu = sh.decode.cpu_ns.load()};
}

void EpochRun::TunerTick(double interval_s) {
  LoaderShared& sh = *shared_;
  const Counters now = ReadCounters();
  TunerSample sample;
  sample.interval_s = interval_s;
  sample.images_consumed = now.images - last_tick_.images;
  sample.consumer_busy_s = double(now.consumer_busy - last_tick_.consumer_busy) * 1e-9;
  sample.stepped_images = now.stepped_images - last_tick_.stepped_images;
  // The tuner's wait signal leaves out each epoch's first batch (filling, not jitter); the
  // timeline shows every wait.
  sample.consumer_wait_s = double(now.steady_wait - last_tick_.steady_wait) * 1e-9;
  const double all_wait_s =
      std::min(double(now.consumer_wait - last_tick_.consumer_wait) * 1e-9, interval_s);
  sample.decoded = now.decoded - last_tick_.decoded;
  sample.decode_busy_s = double(now.decode_busy - last_tick_.decode_busy) * 1e-9;
  sample.reads = now.reads - last_tick_.reads;
  sample.read_busy_s = double(now.read_busy - last_tick_.read_busy) * 1e-9;
  sample.decode_cpu_s = double(now.decode_cpu - last_tick_.decode_cpu) * 1e-9;
  sample.at_s = double(NowNs() - sh.start_ns.load()) * 1e-9;
  last_tick_ = now;
  // The consumer's current wait (it may be blocked right now, not yet counted).
  sample.consumer_wait_s = std::min(sample.consumer_wait_s, interval_s);

  // Queue occupancy: complete batches waiting in the ring, and reads waiting for a decoder.
  int64_t ready_batches = 0;
  {
    std::lock_guard<std::mutex> lock(open_mu_);
    for (int64_t k = consumed_.load(); k < opened_; ++k) {
      const InFlight& e = inflight_[k % kMaxPrefetch];
      if (e.batch.load() == k && e.remaining.load() == 0) ++ready_batches;
    }
  }
  const int prefetch = sh.prefetch.load();
  const int items = std::max(1, read_items_created_.load());
  sh.ring_fill_milli.fetch_add(1000 * ready_batches / std::max(1, prefetch));
  sh.read_fill_milli.fetch_add(
      1000 * std::min<int64_t>(items, std::max<int64_t>(0, queues_->ready.size())) / items);
  sh.fill_samples.fetch_add(1);

  TunerSettings applied{sh.workers.load(), sh.io_depth.load(), prefetch};
  std::string reason;
  double rate = double(sample.images_consumed) / std::max(1e-9, interval_s);
  {
    std::lock_guard<std::mutex> lock(sh.tuner_mu);
    if (sh.tuner) {
      // The budget bounds the ring and the reads in flight together.
      const int64_t reads = std::max<int64_t>(sh.read_buffer_bytes.load(), 0);
      const int64_t per_read = std::max<int64_t>(256 << 10, reads / items);
      sh.tuner->set_max_prefetch(
          sh.AutoPrefetchLimit(int64_t(sh.io_depth.load() + 2 * sh.workers.load()) * per_read));
      const size_t before = sh.tuner->decisions().size();
      applied = sh.tuner->Update(sample);
      if (sh.tuner->decisions().size() > before) reason = sh.tuner->decisions().back().reason;
    }
    if (sh.timeline.size() < LoaderShared::kMaxTimeline) {
      const double t = double(NowNs() - sh.start_ns.load()) * 1e-9;
      sh.timeline.push_back(TimelinePoint{t, rate, all_wait_s / interval_s, applied.workers,
                                          applied.io_depth, applied.prefetch, sh.BytesInUse()});
    }
  }
  const int64_t at = NowNs();
  sh.trace->Counter("settings", at,
                    {{"workers", applied.workers},
                     {"io_depth", applied.io_depth},
                     {"prefetch", applied.prefetch}});
  sh.trace->Counter("images/s", at, {{"images/s", rate}});
  if (!reason.empty()) sh.trace->Instant("tune", at, reason);
  if (applied.io_depth != sh.io_depth.load()) SetIoDepth(applied.io_depth);
  if (applied.workers != sh.workers.load()) SetWorkers(applied.workers);
  if (applied.prefetch != sh.prefetch.load()) SetPrefetch(applied.prefetch);
}

void EpochRun::SetWorkers(int n) {
  n = std::max(1, n);
  shared_->workers.store(n);
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_ || cancelled_.load()) return;
    while (static_cast<int>(decoders_.size()) < n) {
      int id = static_cast<int>(decoders_.size());
      decoders_.emplace_back([this, id] { DecoderLoop(id); });
    }
  }
  Wake();
}

void EpochRun::SetIoDepth(int n) {
  n = std::max(1, n);
  shared_->io_depth.store(n);
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_ || cancelled_.load()) return;
    while (static_cast<int>(readers_.size()) < n) StartReader(static_cast<int>(readers_.size()));
  }
  Wake();
}

void EpochRun::SetPrefetch(int n) {
  n = std::clamp(n, 1, kMaxPrefetch);
  shared_->prefetch.store(n);
  shared_->KeepSlots(n);
  Wake();
}

void EpochRun::Wake() {
  wake_.WakeAll();
}

bool EpochRun::ParkWhileSurplus(int id, const std::atomic<int>& target) {
  while (true) {
    const uint32_t gen = wake_.Load();
    if (cancelled_.load(std::memory_order_acquire)) return false;
    if (id < target.load(std::memory_order_acquire)) return true;
    wake_.Wait(gen);
  }
}

bool EpochRun::WaitAdmitted(int64_t b) {
  while (true) {
    const uint32_t gen = wake_.Load();
    if (cancelled_.load(std::memory_order_acquire)) return false;
    if (b < consumed_.load(std::memory_order_acquire) + shared_->prefetch.load()) return true;
    wake_.Wait(gen);
  }
}

void EpochRun::EnsureOpen(int64_t b) {
  std::lock_guard<std::mutex> lock(open_mu_);
  while (opened_ <= b) {
    const int64_t k = opened_;
    InFlight& e = inflight_[k % kMaxPrefetch];
    e.slot = shared_->pool->Acquire();
    e.open_ns = NowNs();
    e.count = std::min(batch_size_, total_seq_ - k * batch_size_);
    e.remaining.store(e.count, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> elock(e.mu);
      e.error = absl::OkStatus();
      e.error_pos = -1;
    }
    e.batch.store(k, std::memory_order_release);
    ++opened_;
  }
}

EpochRun::ReadItem* EpochRun::AcquireReadItem() {
  ReadItem* item = nullptr;
  if (queues_->free.try_pop(item)) return item;
  // Reads in flight plus decode lookahead: enough for every reader and decoder to hold one.
  const int cap = shared_->io_depth.load() + 2 * shared_->workers.load();
  if (read_items_created_.load() < cap) {
    read_items_created_.fetch_add(1);
    auto owned = std::make_unique<ReadItem>();
    item = owned.get();
    std::lock_guard<std::mutex> lock(queues_->mu);
    queues_->all.push_back(std::move(owned));
    return item;
  }
  queues_->free.pop(item);  // blocks until a decoder returns one (or the stop sentinel)
  return item;
}

void EpochRun::StartReader(int id) {
  auto state = std::make_shared<ReaderState>();
  Reader r{std::thread([this, id, state, keep = shared_] { ReaderLoop(id, state); }), state};
  if (id < static_cast<int>(readers_.size())) {
    readers_[size_t(id)] = std::move(r);
  } else {
    readers_.push_back(std::move(r));
  }
}

void EpochRun::AbandonStuckReads(int64_t older_than_ns, const char* why) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  for (size_t id = 0; id <= readers_.size(); ++id) {
    const bool retry = id == readers_.size();  // the last one checked is the retry reader
    Reader& reader = retry ? retry_reader_ : readers_[id];
    if (reader.state == nullptr) continue;
    ReaderState& st = *reader.state;
    if (st.phase.load(std::memory_order_acquire) != ReaderState::kReading ||
        st.started_ns.load(std::memory_order_relaxed) > older_than_ns) {
      continue;
    }
    int expected = ReaderState::kReading;
    if (!st.phase.compare_exchange_strong(expected, ReaderState::kAbandoned,
                                          std::memory_order_acq_rel)) {
      continue;  // it just finished
    }
    ReadItem* item = st.item;
    const double waited_ms = double(NowNs() - st.started_ns.load()) * 1e-6;
    item->bytes.clear();
    item->status = absl::DeadlineExceededError(
        absl::StrCat(shared_->source->Describe(item->sample), ": read did not complete in ",
                     absl::StrFormat("%.0f", waited_ms), " ms (", why, ")"));
    queues_->ready.push(item);
    reader.thread.detach();  // it keeps what it touches alive; see ReaderState
    if (!shut_down_ && !cancelled_.load()) {
      if (retry) {
        StartRetryReader();
      } else {
        StartReader(int(id));
      }
    }
  }
}

void EpochRun::ReaderLoop(int id, std::shared_ptr<ReaderState> state) {
  TraceTrack* track = shared_->trace->Track(absl::StrCat("reader ", id));
  SampleSource* source = shared_->source.get();
  while (ParkWhileSurplus(id, shared_->io_depth)) {
    const int64_t seq = next_seq_.fetch_add(1, std::memory_order_relaxed);
    if (seq >= total_seq_) return;
    const int64_t t0 = NowNs();
    if (!WaitAdmitted(seq / batch_size_)) return;
    EnsureOpen(seq / batch_size_);
    ReadItem* item = AcquireReadItem();
    if (item == nullptr || cancelled_.load(std::memory_order_acquire)) return;
    shared_->read.AddWait(NowNs() - t0);
    item->seq = seq;
    item->sample = order_[size_t(seq)];
    item->attempt = 0;
    if (!ReadInto(item, state.get(), source, track)) return;  // abandoned
  }
}

void EpochRun::DecoderLoop(int id) {
  TraceTrack* track = shared_->trace->Track(absl::StrCat("decoder ", id));
  DecoderState state;
  while (ParkWhileSurplus(id, shared_->workers)) {
    ReadItem* item = nullptr;
    const int64_t t0 = NowNs();
    queues_->ready.pop(item);
    if (item == nullptr || cancelled_.load(std::memory_order_acquire)) return;
    const int64_t t1 = NowNs();
    shared_->decode.AddWait(t1 - t0);
    const int64_t sample = item->sample;
    const int64_t cpu0 = ThreadCpuNs();
    if (!ProcessSample(item, &state)) queues_->free.push(item);  // else: retried
    const int64_t t2 = NowNs();
    shared_->decode.AddCpu(ThreadCpuNs() - cpu0);
    shared_->decode.AddBusy(t2 - t1);
    shared_->decode.AddItem();
    track->Span(TraceTrack::Kind::kDecode, t1, t2, sample);
  }
}

absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> EpochRun::DecodeForCache(
    const ReadItem& item, DecoderState* state) {
  const LoaderOptions& o = shared_->options;
  absl::StatusOr<ImageHeader> header =
      state->decoder.ReadHeader(item.bytes.data(), item.bytes.size());
  if (!header.ok()) return header.status();
  const int W = header->width, H = header->height;
  const int shorter = std::min(W, H);
  const int target = std::min(shorter, kDecodedCacheScale * o.size());
  const int want_w = int(std::ceil(double(target) * W / shorter));
  const int want_h = int(std::ceil(double(target) * H / shorter));
  absl::StatusOr<DecodedRegion> region =
      state->decoder.Decode(item.bytes.data(), item.bytes.size(), Rect{0, 0, double(W), double(H)},
                            want_w, want_h, o.max_image_pixels());
  if (!region.ok()) return region.status();
  auto entry = std::make_shared<SampleCache::Entry>();
  entry->orig_width = W;
  entry->orig_height = H;
  if (region->width > want_w || region->height > want_h) {
    ResizeWhole(*region, want_w, want_h, &entry->data);
    entry->width = want_w;
    entry->height = want_h;
  } else {
    entry->width = region->width;
    entry->height = region->height;
    entry->data.resize(size_t(region->width) * region->height * 3);
    for (int y = 0; y < region->height; ++y) {
      std::memcpy(entry->data.data() + size_t(y) * region->width * 3,
                  region->pixels + size_t(y) * region->stride, size_t(region->width) * 3);
    }
  }
  if (!shared_->cache->full()) shared_->cache->Put(item.sample, entry);
  return std::shared_ptr<const SampleCache::Entry>(std::move(entry));
}

absl::Status EpochRun::DecodeInto(const ReadItem& item, uint8_t* dst, DecoderState* state) {
  const LoaderOptions& o = shared_->options;
  if (o.synthetic()) {  // benchmarks: a pre-decoded sample, no decode
    std::memset(dst, int(item.sample & 0xFF), size_t(shared_->sample_bytes));
    return absl::OkStatus();
  }
  const std::vector<uint8_t>& bytes = item.bytes;
  const int64_t sample = item.sample;
  std::shared_ptr<const SampleCache::Entry> cached = item.decoded;
  if (o.cache() == Cache::kDecoded && cached == nullptr) {
    absl::StatusOr<std::shared_ptr<const SampleCache::Entry>> made = DecodeForCache(item, state);
    if (!made.ok()) return made.status();
    cached = *std::move(made);
  }
  ImageHeader header_value;
  DecodedRegion cached_region;
  if (cached != nullptr) {
    header_value = ImageHeader{ImageFormat::kJpeg, cached->orig_width, cached->orig_height};
    cached_region.pixels = cached->data.data();
    cached_region.width = cached->width;
    cached_region.height = cached->height;
    cached_region.stride = size_t(cached->width) * 3;
    cached_region.scale_x = double(cached->width) / cached->orig_width;
    cached_region.scale_y = double(cached->height) / cached->orig_height;
  } else {
    absl::StatusOr<ImageHeader> h = state->decoder.ReadHeader(bytes.data(), bytes.size());
    if (!h.ok()) return h.status();
    // Refuse absurd sizes before any geometry is computed from them (nor memory allocated).
    if (int64_t{h->width} * h->height > o.max_image_pixels()) {
      return absl::ResourceExhaustedError(
          absl::StrCat("image of ", h->width, "x", h->height, " pixels exceeds max_image_pixels (",
                       o.max_image_pixels(), "): refused before decoding"));
    }
    header_value = *h;
  }
  const ImageHeader* header = &header_value;
  auto decode = [&](const Rect& rect, int min_w, int min_h) -> absl::StatusOr<DecodedRegion> {
    if (cached != nullptr) return cached_region;
    return state->decoder.Decode(bytes.data(), bytes.size(), rect, min_w, min_h,
                                 o.max_image_pixels());
  };
  const int size = o.size();
  const uint64_t seed = o.seed(), epoch = uint64_t(epoch_), index = uint64_t(sample);
  // Float dtypes on the CPU: resample into uint8 scratch, then normalise into the slot.
  uint8_t* out = dst;
  if (shared_->host_dtype != DType::kUint8) {
    state->u8.resize(size_t(3) * size * size);
    out = state->u8.data();
  }
  if (o.transform() == Transform::kTrain) {
    SampleRng crop_rng(seed, epoch, index, kRngCrop);
    const CropBox box =
        RandomResizedCropBox(header->width, header->height, o.scale(), o.ratio(), crop_rng);
    const bool flip = o.flip() && SampleRng(seed, epoch, index, kRngFlip).Uniform() < 0.5;
    const Rect rect{double(box.left), double(box.top), double(box.width), double(box.height)};
    absl::StatusOr<DecodedRegion> region = decode(rect, size, size);
    if (!region.ok()) return region.status();
    ResampleInto(*region, rect, size, size, flip, shared_->host_layout, out, &state->scratch);
  } else {
    const EvalGeometry g =
        ComputeEvalGeometry(header->width, header->height, o.resize_size(), size);
    const Rect whole{0, 0, double(header->width), double(header->height)};
    // Decode at the smallest DCT scale that keeps the resized size (at most the image's own).
    absl::StatusOr<DecodedRegion> region =
        decode(whole, int(std::min<int64_t>(g.resized_w, header->width)),
               int(std::min<int64_t>(g.resized_h, header->height)));
    if (!region.ok()) return region.status();
    ResizeThenCropInto(*region, g, header->width, header->height, size, size, shared_->host_layout,
                       out, &state->scratch);
  }
  if (out != dst) {
    ConvertSample(out, 3 * int64_t{size} * size, shared_->host_layout, shared_->host_dtype,
                  shared_->norm, dst);
  }
  return absl::OkStatus();
}

namespace {
absl::Status WithPath(const absl::Status& s, const std::string& path) {
  // Reader errors already start with the path; decoder errors do not.
  if (absl::StartsWith(s.message(), path)) return absl::Status(s.code(), s.message());
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}
}  // namespace

bool EpochRun::ProcessSample(ReadItem* item, DecoderState* state) {
  const int64_t b = item->seq / batch_size_, pos = item->seq % batch_size_;
  InFlight& e = inflight_[b % kMaxPrefetch];
  internal::BatchSlot* slot = e.slot.get();
  uint8_t* dst = slot->images + size_t(pos) * size_t(shared_->sample_bytes);

  // A status that crosses threads is copied, never shared: its reference count lives in
  // Debian's prebuilt (uninstrumented) Abseil, where ThreadSanitizer cannot see its ordering.
  absl::Status st;
  if (!item->status.ok()) {
    st = absl::Status(item->status.code(), item->status.message());
  } else {
    // A throw from a library (OpenCV, an allocation) becomes this sample's error; it must never
    // escape a worker thread (that would terminate the process).
    try {
      st = DecodeInto(*item, dst, state);
    } catch (const std::bad_alloc&) {
      st = absl::ResourceExhaustedError("out of memory while decoding");
    } catch (const std::exception& e) {
      st = absl::InternalError(absl::StrCat("decoding failed: ", e.what()));
    }
  }
  if (!st.ok()) {
    const std::string path = shared_->source->Describe(item->sample);
    st = WithPath(st, path);
    bool first_failure;  // a file that fails twice in an epoch (as a replacement too) counts once
    {
      std::lock_guard<std::mutex> lock(bad_mu_);
      first_failure = bad_samples_.insert(item->sample).second;
    }
    if (first_failure) {
      shared_->RecordError(SampleError{path, std::string(st.message()), item->sample, epoch_});
    }
    if (shared_->options.on_error() == OnError::kSkip && item->attempt < kReplaceAttempts) {
      // Replace it by another sample of this epoch, chosen from (seed, epoch, position,
      // attempt) so the run stays reproducible, avoiding samples already known bad. The read
      // goes through the retry reader, under the read timeout like every read.
      const int64_t r = PickReplacement(item->seq, item->sample, &item->attempt);
      if (r >= 0) {
        item->sample = r;
        item->status = absl::OkStatus();
        StartRetryReaderIfNeeded();
        queues_->retry.push(item);
        return true;
      }
    }
  }
  if (st.ok()) {
    slot->labels[size_t(pos)] = shared_->dataset.samples[size_t(item->sample)].label;
    slot->indices[size_t(pos)] = item->sample;
  } else {
    std::memset(dst, 0, size_t(shared_->sample_bytes));
    slot->labels[size_t(pos)] = -1;
    slot->indices[size_t(pos)] = item->sample;
    std::lock_guard<std::mutex> lock(e.mu);
    if (e.error_pos < 0 || pos < e.error_pos) {
      e.error = absl::Status(st.code(), st.message());  // a copy, not a shared reference
      e.error_pos = pos;
    }
  }
  CompleteSample(e);
  return false;
}

int64_t EpochRun::PickReplacement(int64_t seq, int64_t failed, int* attempt) {
  std::lock_guard<std::mutex> lock(bad_mu_);
  bad_samples_.insert(failed);
  if (*attempt >= kReplaceAttempts) return -1;
  ++*attempt;
  // Draws that hit a sample already known bad are free: only reads count as attempts.
  SampleRng rng(shared_->options.seed(), uint64_t(epoch_), uint64_t(seq),
                kRngReplace + uint64_t(*attempt) * 0x10000);
  for (int draw = 0; draw < 256; ++draw) {
    const int64_t r = order_[size_t(rng.Below(uint64_t(total_seq_)))];
    if (bad_samples_.count(r) == 0) return r;
  }
  return -1;
}

void EpochRun::StartRetryReaderIfNeeded() {
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (retry_reader_.state != nullptr || shut_down_ || cancelled_.load()) return;
  StartRetryReader();
}

void EpochRun::StartRetryReader() {
  auto state = std::make_shared<ReaderState>();
  retry_reader_ = Reader{std::thread([this, state, keep = shared_] { RetryLoop(state); }), state};
}

void EpochRun::RetryLoop(std::shared_ptr<ReaderState> state) {
  TraceTrack* track = shared_->trace->Track("retry reader");
  SampleSource* source = shared_->source.get();
  while (true) {
    ReadItem* item = nullptr;
    queues_->retry.pop(item);
    if (item == nullptr || cancelled_.load(std::memory_order_acquire)) return;
    if (!ReadInto(item, state.get(), source, track)) return;  // abandoned
  }
}

bool EpochRun::ReadInto(ReadItem* item, ReaderState* state, SampleSource* source,
                        TraceTrack* track) {
  const int64_t t1 = NowNs();
  item->decoded.reset();
  if (shared_->options.synthetic()) {  // benchmarks: the pipeline without I/O
    item->bytes.clear();
    item->status = absl::OkStatus();
    shared_->read.AddItem();
    queues_->ready.push(item);
    return true;
  }
  if (SampleCache* cache = shared_->cache.get()) {
    std::shared_ptr<const SampleCache::Entry> hit = cache->Get(item->sample);
    if (hit != nullptr) {
      cache->CountHit();
      if (shared_->options.cache() == Cache::kDecoded) {
        item->decoded = std::move(hit);
        item->bytes.clear();
      } else {
        item->bytes.assign(hit->data.begin(), hit->data.end());
      }
      item->status = absl::OkStatus();
      queues_->ready.push(item);
      return true;
    }
    cache->CountMiss();
  }
  // Buffers move between the item and the reader's state; their total capacity is what the run
  // holds in reads, so the change is (item's new capacity) - (state's old capacity).
  const size_t before = state->buffer.capacity();
  state->buffer.swap(item->bytes);
  state->item = item;
  const int64_t sample = item->sample;  // after the publish below, the item may be taken away
  state->started_ns.store(t1, std::memory_order_relaxed);
  state->phase.store(ReaderState::kReading, std::memory_order_release);
  absl::Status status = source->Read(sample, &state->buffer);
  int expected = ReaderState::kReading;
  if (!state->phase.compare_exchange_strong(expected, ReaderState::kIdle,
                                            std::memory_order_acq_rel)) {
    return false;  // abandoned by the watchdog: the run may be gone; touch nothing of it
  }
  item->bytes.swap(state->buffer);
  item->status = std::move(status);
  if (item->status.ok() && shared_->options.cache() == Cache::kBytes && !shared_->cache->full()) {
    auto entry = std::make_shared<SampleCache::Entry>();
    entry->data = item->bytes;
    shared_->cache->Put(item->sample, std::move(entry));
  }
  const int64_t delta = int64_t(item->bytes.capacity()) - int64_t(before);
  shared_->read_buffer_bytes.fetch_add(delta, std::memory_order_relaxed);
  run_read_bytes_.fetch_add(delta, std::memory_order_relaxed);
  const int64_t t2 = NowNs();
  shared_->read.AddBusy(t2 - t1);
  shared_->read.AddItem();
  track->Span(TraceTrack::Kind::kRead, t1, t2, item->sample);
  queues_->ready.push(item);
  return true;
}

absl::Status EpochRun::TooManyErrors() {
  const int64_t max = shared_->options.max_errors();
  if (max <= 0 || shared_->error_count() <= max) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(shared_->error_count(), " samples failed, more than max_errors=", max,
                   " (a broken data set or storage?); the first: ", shared_->FirstErrorText()));
}

void EpochRun::CompleteSample(InFlight& e) {
  if (e.remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    std::lock_guard<std::mutex> lock(done_mu_);
    done_cv_.notify_all();
  }
}

absl::StatusOr<Batch> EpochRun::Next(const std::function<absl::Status()>& interrupted,
                                     absl::Duration poll) {
  const int64_t entered = NowNs();
  shared_->consumer.AddBusy(entered - last_return_ns_);
  // The step just ended worked on the batch returned last: its images go with that busy time
  // (counted here, not at the return, so that any window sees matching images and time).
  shared_->stepped_images.fetch_add(held_images_, std::memory_order_relaxed);
  held_images_ = 0;
  const int64_t b = consumed_.load(std::memory_order_acquire);
  if (b >= num_batches_) {
    Shutdown();
    last_return_ns_ = NowNs();
    return absl::OutOfRangeError(absl::StrCat("end of epoch ", epoch_));
  }
  if (cancelled_.load()) return absl::CancelledError("the epoch was cancelled");
  if (absl::Status flood = TooManyErrors(); !flood.ok()) {
    last_return_ns_ = NowNs();
    return flood;
  }
  InFlight& e = inflight_[b % kMaxPrefetch];
  {
    std::unique_lock<std::mutex> lock(done_mu_);
    const auto poll_ns = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(poll));
    while (!(e.batch.load(std::memory_order_acquire) == b &&
             e.remaining.load(std::memory_order_acquire) == 0)) {
      if (cancelled_.load()) return absl::CancelledError("the epoch was cancelled");
      if (absl::Status flood = TooManyErrors(); !flood.ok()) {
        last_return_ns_ = NowNs();
        return flood;
      }
      if (done_cv_.wait_for(lock, poll_ns) == std::cv_status::timeout && interrupted) {
        lock.unlock();
        absl::Status s = interrupted();
        lock.lock();
        if (!s.ok()) {
          shared_->AddConsumerWait(b, NowNs() - entered);
          last_return_ns_ = NowNs();
          return s;
        }
      }
    }
  }
  const int64_t got = NowNs();
  shared_->AddConsumerWait(b, got - entered);
  consumer_track_->Span(TraceTrack::Kind::kWait, entered, got, b);
  batch_track_->Span(TraceTrack::Kind::kBatch, e.open_ns, got, b);
  Batch batch;
  batch.slot_ = std::move(e.slot);
  shared_->pool->MarkHandedOut(batch.slot_.get());
  batch.size_ = e.count;
  absl::Status error;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    error = std::move(e.error);
    e.error = absl::OkStatus();
  }
  e.batch.store(-1, std::memory_order_relaxed);
  consumed_.store(b + 1, std::memory_order_release);
  Wake();
  shared_->consumer.AddItem();
  shared_->batches.fetch_add(1, std::memory_order_relaxed);
  shared_->images.fetch_add(batch.size_, std::memory_order_relaxed);
  if (b + 1 == num_batches_) Shutdown();  // free the threads as soon as the epoch is done
  held_images_ = batch.size_;
  last_return_ns_ = NowNs();
  if (!error.ok()) return error;
  const LoaderOptions& o = shared_->options;
  batch.index_ = b;
  batch.epoch_ = epoch_;
  batch.layout_ = o.layout();
  batch.dtype_ = o.dtype();
  if (shared_->copy_stage != nullptr) {
    absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> on_device =
        shared_->copy_stage->Submit(std::move(batch.slot_), batch.size_);
    if (!on_device.ok()) return on_device.status();
    batch.device_batch_ = *std::move(on_device);
    batch.device_ = shared_->device;
  }
  batch.height_ = o.size();
  batch.width_ = o.size();
  return batch;
}

void EpochRun::Cancel() {
  if (cancelled_.exchange(true)) return;
  int threads = 0;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    threads = static_cast<int>(readers_.size() + decoders_.size());
  }
  for (int i = 0; i < threads; ++i) {
    queues_->ready.push(nullptr);
    queues_->free.push(nullptr);
  }
  queues_->retry.push(nullptr);
  Wake();
  {
    std::lock_guard<std::mutex> lock(tuner_mu_);
    tuner_cv_.notify_all();
  }
  std::lock_guard<std::mutex> lock(done_mu_);
  done_cv_.notify_all();
}

void EpochRun::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  Cancel();
  AbandonStuckReads(std::numeric_limits<int64_t>::max(), "the epoch was stopped");
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    for (auto& r : readers_) {
      if (r.thread.joinable()) threads.push_back(std::move(r.thread));
    }
    for (auto& t : decoders_) threads.push_back(std::move(t));
    if (tuner_thread_.joinable()) threads.push_back(std::move(tuner_thread_));
    if (retry_reader_.thread.joinable()) threads.push_back(std::move(retry_reader_.thread));
    readers_.clear();
    decoders_.clear();
  }
  for (auto& t : threads) t.join();
  // Read buffers are freed with the run; keep the accounting honest.
  std::lock_guard<std::mutex> lock(queues_->mu);
  for (auto& item : queues_->all) item->bytes = std::vector<uint8_t>();
  shared_->read_buffer_bytes.fetch_sub(run_read_bytes_.exchange(0), std::memory_order_relaxed);
  // Slots of batches that were opened but never handed out go back to the pool.
  for (int i = 0; i < kMaxPrefetch; ++i) inflight_[i].slot.reset();
}

}  // namespace feedline
