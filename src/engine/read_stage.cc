#include "engine/read_stage.h"

#include <pthread.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <new>
#include <unordered_set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/sleep.h"

namespace feedline {

// One reader thread's state, shared with the watchdog. A read that outlives the timeout is
// abandoned: the watchdog fails its sample and starts a replacement thread; the stuck thread,
// when (if) its read returns, sees the abandonment and exits, touching nothing but this record
// and the loader's shared state, both of which it keeps alive.
struct ReadStage::ReaderState {
  enum : int { kIdle = 0, kReading = 1, kAbandoned = 2 };
  std::atomic<int> phase{kIdle};
  std::atomic<int64_t> started_ns{0};
  ReadItem* item = nullptr;  // the item being read and the entry (published by the phase store)
  int entry = 0;
  Record record;  // reads land here, then move into the entry
};

// Shared by the async reader and the callbacks of its reads, which may outlive the stage.
struct ReadStage::AsyncState {
  std::mutex mu;
  bool stopped = false;        // under mu; after it is set, callbacks touch nothing of the run
  ReadStage* stage = nullptr;  // valid while !stopped
  std::unordered_set<AsyncRead*> live;  // under mu: the reads in flight (neither ended nor
                                        // abandoned)
  WakeWord wake;                        // a read ended or was abandoned, or the stage stopped
};

// One read in flight: the record it fills (the entry's buffers, swapped in) and where it goes.
struct ReadStage::AsyncRead {
  std::shared_ptr<AsyncState> state;
  ReadItem* item = nullptr;
  int entry = 0;
  int64_t start_ns = 0;
  int64_t before = 0;      // the entry's buffer capacity when the read started
  bool abandoned = false;  // under state->mu: failed by the watchdog; the data set still owns
                           // `record` until its callback runs
  Record record;
};

namespace {

int64_t Capacity(const Record& r) {
  int64_t n = int64_t(r.bytes.capacity());
  for (const Record::Member& m : r.members) n += int64_t(m.bytes.capacity());
  return n;
}

// A data set's Read, with exceptions turned into the sample's error.
absl::Status SafeRead(const Dataset& d, int64_t index, Record* record) {
  try {
    return d.Read(index, record);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory while reading");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the data set's Read threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("the data set's Read threw a non-standard exception");
  }
}

// Entries that need no read: the transform has what it needs, or the bytes cache has the
// record. True when `e` was served so (its status set).
bool ServedWithoutRead(const LoaderShared& sh, SampleCache* cache, ReadEntry* e) {
  if (sh.transform->SkipsRead(e->sample)) {
    e->record.Clear();
    e->status = absl::OkStatus();
    return true;
  }
  if (cache == nullptr) return false;
  std::shared_ptr<const SampleCache::Entry> hit = cache->Get(e->sample);
  if (hit == nullptr) {
    cache->CountMiss();
    return false;
  }
  cache->CountHit();
  e->record.bytes.assign(hit->data.begin(), hit->data.end());
  e->record.label = hit->label;
  e->record.members = hit->members;
  e->record.meta = hit->meta;
  e->status = absl::OkStatus();
  return true;
}

// A record read well goes into the bytes cache while it has room.
void KeepInCache(SampleCache* cache, const ReadEntry& e) {
  if (!e.status.ok() || cache == nullptr || cache->full()) return;
  auto entry = std::make_shared<SampleCache::Entry>();
  entry->data = e.record.bytes;
  entry->label = e.record.label;
  entry->members = e.record.members;
  entry->meta = e.record.meta;
  cache->Put(e.sample, std::move(entry));
}

}  // namespace

ReadStage::ReadStage(EpochCore* core, BatchRing* ring, ItemQueues* queues, int64_t start_seq)
    : core_(core),
      ring_(ring),
      queues_(queues),
      next_seq_(start_seq),
      async_(core->shared->dataset->async_reads()) {
  if (async_) {
    async_state_ = std::make_shared<AsyncState>();
    async_state_->stage = this;
  }
}

void ReadStage::SetThreads(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || core_->is_cancelled() || core_->shared->inline_reads) return;
  if (async_) n = std::min(n, 1);  // one thread starts every read
  while (static_cast<int>(readers_.size()) < n) StartReader(static_cast<int>(readers_.size()));
}

int ReadStage::threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(readers_.size());
}

void ReadStage::StartReader(int id) {
  auto state = std::make_shared<ReaderState>();
  Reader r{std::thread([this, id, state, keep = core_->shared] { ReaderLoop(id, state); }), state};
  if (id < static_cast<int>(readers_.size())) {
    readers_[size_t(id)] = std::move(r);
  } else {
    readers_.push_back(std::move(r));
  }
}

void ReadStage::StartRetryReader() {
  auto state = std::make_shared<ReaderState>();
  retry_reader_ =
      Reader{std::thread([this, state, keep = core_->shared] { RetryLoop(state); }), state};
}

void ReadStage::Resubmit(ReadItem* item) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (retry_reader_.state == nullptr && !stopped_ && !core_->is_cancelled()) StartRetryReader();
  }
  queues_->retry.push(item);
}

void ReadStage::AbandonStuckReads(int64_t older_than_ns, const char* why) {
  if (async_state_ != nullptr) AbandonAsyncReads(older_than_ns, why);
  std::lock_guard<std::mutex> lock(mu_);
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
    // The entries before the stuck one were read; it and the ones after it fail.
    const std::string stuck =
        core_->shared->dataset->Describe(item->entries[size_t(st.entry)].sample);
    for (int k = st.entry; k < item->count; ++k) {
      ReadEntry& e = item->entries[size_t(k)];
      e.record.Clear();
      e.status = k == st.entry
                     ? absl::DeadlineExceededError(
                           absl::StrCat(stuck, ": read did not complete in ",
                                        absl::StrFormat("%.0f", waited_ms), " ms (", why, ")"))
                     : absl::DeadlineExceededError(absl::StrCat(
                           core_->shared->dataset->Describe(e.sample), ": not read: ", stuck,
                           " before it in the same chunk did not complete (", why, ")"));
    }
    queues_->ready.push(item);
    reader.thread.detach();  // it keeps what it touches alive; see ReaderState
    if (!stopped_ && !core_->is_cancelled()) {
      if (retry) {
        StartRetryReader();
      } else {
        StartReader(int(id));
      }
    }
  }
}

void ReadStage::Stop(std::vector<std::thread>* join) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
  }
  if (async_state_ != nullptr) {
    {
      std::lock_guard<std::mutex> lock(async_state_->mu);
      async_state_->stopped = true;  // reads still in flight end without touching the run
    }
    async_state_->wake.WakeAll();  // the reader may wait for room in flight
  }
  AbandonStuckReads(std::numeric_limits<int64_t>::max(), "the epoch was stopped");
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& r : readers_) {
    if (r.thread.joinable()) join->push_back(std::move(r.thread));
  }
  if (retry_reader_.thread.joinable()) join->push_back(std::move(retry_reader_.thread));
  readers_.clear();
}

bool ReadStage::Claim(int64_t* seq_out, int64_t* end_out) {
  const int64_t bs = core_->batch_size;
  const int64_t chunk = std::max(1, core_->shared->tuning.chunk.load(std::memory_order_relaxed));
  int64_t seq = next_seq_.load(std::memory_order_relaxed), end = 0;
  do {
    if (seq >= core_->run_seq) return false;
    end = std::min({seq + chunk, (seq / bs + 1) * bs, core_->run_seq});
  } while (!next_seq_.compare_exchange_weak(seq, end, std::memory_order_relaxed));
  *seq_out = seq;
  *end_out = end;
  return true;
}

void ReadStage::ReadInline(ReadEntry* e) {
  e->status = SafeRead(*core_->shared->dataset, e->sample, &e->record);
}

void ReadStage::ReaderLoop(int id, std::shared_ptr<ReaderState> state) {
  internal::worker_of = core_;
  LoaderShared& sh = *core_->shared;
  pthread_setname_np(pthread_self(), "feedline-read");  // for top, perf, gdb
  TraceTrack* track = sh.trace->Track(absl::StrCat("reader ", id));
  while (core_->ParkWhileSurplus(id, sh.tuning.io_depth)) {
    int64_t seq = 0, end = 0;
    if (!Claim(&seq, &end)) return;
    const int64_t t0 = NowNs();
    const int64_t b = seq / core_->batch_size;
    if (!ring_->WaitAdmitted(b) || !ring_->EnsureOpen(b)) return;
    // Reads in flight plus map lookahead: enough for every reader and worker to hold one.
    ReadItem* item = queues_->Acquire(sh.tuning.io_depth.load() + 2 * sh.tuning.workers.load());
    if (item == nullptr || core_->is_cancelled()) return;
    sh.counters.read.AddWait(NowNs() - t0);
    item->Fill(*core_, seq, end);
    if (async_) {
      if (!StartReads(item, track)) return;  // cancelled
    } else if (!ReadInto(item, state.get(), track)) {
      return;  // abandoned
    }
  }
}

void ReadStage::RetryLoop(std::shared_ptr<ReaderState> state) {
  internal::worker_of = core_;
  TraceTrack* track = core_->shared->trace->Track("retry reader");
  while (true) {
    ReadItem* item = nullptr;
    queues_->retry.pop(item);
    if (item == nullptr || core_->is_cancelled()) return;
    if (!ReadInto(item, state.get(), track)) return;  // abandoned
  }
}

bool ReadStage::ReadInto(ReadItem* item, ReaderState* state, TraceTrack* track) {
  LoaderShared& sh = *core_->shared;
  const int64_t t1 = NowNs();
  SampleCache* cache = sh.memory.cache_holds_bytes ? sh.memory.cache.get() : nullptr;
  int64_t read = 0;  // entries read from the data set (not from a cache)
  for (int k = 0; k < item->count; ++k) {
    ReadEntry& e = item->entries[size_t(k)];
    if (ServedWithoutRead(sh, cache, &e)) continue;
    // Buffers move between the entry and the reader's state; their total capacity is what the
    // run holds in reads, so the change is (entry's new capacity) - (state's old capacity).
    const int64_t before = Capacity(state->record);
    std::swap(state->record, e.record);
    state->item = item;
    state->entry = k;
    const int64_t sample = e.sample;  // after the publish below, the item may be taken away
    state->started_ns.store(NowNs(), std::memory_order_relaxed);
    state->phase.store(ReaderState::kReading, std::memory_order_release);
    absl::Status status = SafeRead(*sh.dataset, sample, &state->record);
    int expected = ReaderState::kReading;
    if (!state->phase.compare_exchange_strong(expected, ReaderState::kIdle,
                                              std::memory_order_acq_rel)) {
      return false;  // abandoned by the watchdog: the run may be gone; touch nothing of it
    }
    std::swap(e.record, state->record);
    e.status = std::move(status);
    KeepInCache(cache, e);
    const int64_t delta = Capacity(e.record) - before;
    sh.counters.read_buffer_bytes.fetch_add(delta, std::memory_order_relaxed);
    buffer_bytes_.fetch_add(delta, std::memory_order_relaxed);
    ++read;
  }
  if (read > 0) {
    const int64_t t2 = NowNs();
    sh.counters.read.AddBusy(t2 - t1);
    sh.counters.read.items.fetch_add(read, std::memory_order_relaxed);
    track->Span(TraceTrack::Kind::kRead, t1, t2, item->first().sample);
  }
  queues_->ready.push(item);
  return true;
}

void ReadStage::AbandonAsyncReads(int64_t older_than_ns, const char* why) {
  AsyncState& st = *async_state_;
  int abandoned = 0;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    if (st.stopped) return;
    for (auto it = st.live.begin(); it != st.live.end();) {
      AsyncRead* read = *it;
      if (read->start_ns > older_than_ns) {
        ++it;
        continue;
      }
      // The entry fails now; the record stays with the read (the data set may still write
      // into it) and a fresh one takes its place.
      read->abandoned = true;
      it = st.live.erase(it);
      ++abandoned;
      ReadEntry& e = read->item->entries[size_t(read->entry)];
      const double waited_ms = double(NowNs() - read->start_ns) * 1e-6;
      e.record = Record();
      e.status = absl::DeadlineExceededError(
          absl::StrCat(core_->shared->dataset->Describe(e.sample), ": read did not complete in ",
                       absl::StrFormat("%.0f", waited_ms), " ms (", why, ")"));
      if (--read->item->pending == 0) queues_->ready.push(read->item);
    }
  }
  if (abandoned > 0) st.wake.WakeAll();
}

bool ReadStage::StartReads(ReadItem* item, TraceTrack* track) {
  LoaderShared& sh = *core_->shared;
  AsyncState& st = *async_state_;
  SampleCache* cache = sh.memory.cache_holds_bytes ? sh.memory.cache.get() : nullptr;
  const int64_t t0 = NowNs();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    item->pending = 1;  // this function's own hold, dropped at the end
  }
  bool cancelled = false;
  for (int k = 0; k < item->count; ++k) {
    ReadEntry& e = item->entries[size_t(k)];
    if (ServedWithoutRead(sh, cache, &e)) continue;
    // Room in flight: at most io_depth reads at once.
    while (true) {
      const uint32_t gen = st.wake.Load();
      if (core_->is_cancelled()) break;
      {
        std::lock_guard<std::mutex> lock(st.mu);
        if (int(st.live.size()) < std::max(1, sh.tuning.io_depth.load())) break;
      }
      st.wake.Wait(gen);
    }
    if (core_->is_cancelled()) {
      // The entries not started hold stale records: they fail, should anyone look.
      for (int j = k; j < item->count; ++j) {
        item->entries[size_t(j)].status = absl::CancelledError("the epoch was stopped");
      }
      cancelled = true;
      break;
    }
    auto* read = new AsyncRead;
    read->state = async_state_;
    read->item = item;
    read->entry = k;
    read->before = Capacity(e.record);
    std::swap(read->record, e.record);
    read->start_ns = NowNs();
    {
      std::lock_guard<std::mutex> lock(st.mu);
      ++item->pending;
      st.live.insert(read);
    }
    const int64_t sample = e.sample;  // the entry may be handed on before ReadAsync returns
    try {
      sh.dataset->ReadAsync(sample, &read->record,
                            [read](absl::Status s) { Complete(read, std::move(s)); });
    } catch (const std::exception& ex) {  // the contract says it does not throw; if it does
      Complete(read,
               absl::InternalError(absl::StrCat("the data set's ReadAsync threw: ", ex.what())));
    }
  }
  track->Span(TraceTrack::Kind::kRead, t0, NowNs(), item->first().sample);
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.stopped) return false;
  if (--item->pending == 0) queues_->ready.push(item);
  return !cancelled;
}

void ReadStage::Complete(AsyncRead* read, absl::Status status) {
  std::shared_ptr<AsyncState> st = read->state;
  {
    std::lock_guard<std::mutex> lock(st->mu);
    if (read->abandoned) {  // failed by the watchdog already (and no longer in flight)
      delete read;
      return;
    }
    st->live.erase(read);
    if (!st->stopped) {
      ReadStage& stage = *st->stage;
      LoaderShared& sh = *stage.core_->shared;
      ReadItem* item = read->item;
      ReadEntry& e = item->entries[size_t(read->entry)];
      std::swap(e.record, read->record);
      e.status = std::move(status);
      KeepInCache(sh.memory.cache_holds_bytes ? sh.memory.cache.get() : nullptr, e);
      const int64_t delta = Capacity(e.record) - read->before;
      sh.counters.read_buffer_bytes.fetch_add(delta, std::memory_order_relaxed);
      stage.buffer_bytes_.fetch_add(delta, std::memory_order_relaxed);
      // Busy time is each read's latency (Little's law on it sets the I/O depth).
      sh.counters.read.AddBusy(NowNs() - read->start_ns);
      sh.counters.read.items.fetch_add(1, std::memory_order_relaxed);
      if (--item->pending == 0) stage.queues_->ready.push(item);
    }
  }
  st->wake.WakeAll();
  delete read;
}

}  // namespace feedline
