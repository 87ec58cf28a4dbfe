#include "engine/map_stage.h"

#include <exception>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "feedline/error.h"

namespace feedline {
namespace {

// CPU reported by this worker thread's transform as spent elsewhere (ReportOffThreadCpu), not yet
// added to the stage's counter.
thread_local int64_t off_thread_cpu_ns = 0;

absl::Status WithName(const absl::Status& s, const std::string& name) {
  // Read errors already start with the sample's name; transform errors do not.
  if (absl::StartsWith(s.message(), name)) return absl::Status(s.code(), s.message());
  return absl::Status(s.code(), absl::StrCat(name, ": ", s.message()));
}

// The transform's Apply, with exceptions turned into the sample's error: a throw from user code
// or a library (OpenCV, an allocation) must never escape a worker thread (that would terminate
// the process).
absl::Status SafeApply(const SampleTransform& t, const Record& record, const SampleContext& ctx,
                       SampleTransform::WorkerState* state, SampleWriter& out) {
  try {
    return t.Apply(record, ctx, state, out);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError("out of memory in the transform");
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("the transform threw: ", e.what()));
  } catch (...) {
    return absl::InternalError("the transform threw a non-standard exception");
  }
}

}  // namespace

void ReportOffThreadCpu(int64_t ns) {
  if (ns > 0) off_thread_cpu_ns += ns;
}

void MapStage::SetThreads(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || core_->is_cancelled()) return;
  WorkerPool& pool = core_->shared->Workers();
  while (static_cast<int>(workers_.size()) < n) {
    const int id = static_cast<int>(workers_.size());
    workers_.push_back(
        pool.Run(id, [this, id](SampleTransform::WorkerState* state) { WorkerLoop(id, state); }));
  }
}

int MapStage::threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(workers_.size());
}

void MapStage::Stop() {
  std::vector<WorkerPool::Ticket> started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    started.swap(workers_);
  }
  for (const WorkerPool::Ticket& t : started) WorkerPool::Wait(t);
}

bool MapStage::WaitUntilDone(std::chrono::steady_clock::time_point deadline) {
  std::vector<WorkerPool::Ticket> started;
  {
    std::lock_guard<std::mutex> lock(mu_);
    started = workers_;
  }
  for (const WorkerPool::Ticket& t : started) {
    if (!WorkerPool::WaitUntil(t, deadline)) return false;
  }
  return true;
}

void MapStage::WorkerLoop(int id, SampleTransform::WorkerState* state) {
  internal::worker_of = core_;
  // The thread goes on to other epochs' work: it is this epoch's only while here.
  struct Leave {
    ~Leave() { internal::worker_of = nullptr; }
  } leave;
  LoaderShared& sh = *core_->shared;
  TraceTrack* track = sh.trace->Track(absl::StrCat("worker ", id));
  std::vector<uint8_t> scratch;  // batch assembly
  if (sh.inline_reads) {
    InlineLoop(id, state, &scratch, track);
    return;
  }
  double map_ns = 0;  // smoothed time per sample
  CpuMeter cpu(&sh.counters.map);
  while (core_->ParkWhileSurplus(id, sh.tuning.workers)) {
    ReadItem* item = nullptr;
    const int64_t t0 = NowNs();
    queues_->ready.pop(item);
    if (item == nullptr || core_->is_cancelled()) return;
    const int64_t t1 = NowNs();
    sh.counters.map.AddWait(t1 - t0);
    const int64_t first = item->first().sample;
    const int n = item->count;
    ProcessItem(item, state, &scratch);  // gives the item back (or on for a retry)
    Account(n, first, t1, &cpu, &map_ns, track);
  }
}

void MapStage::CpuMeter::Read(int64_t now, bool force) {
  if (!force && now - wall_ < kEveryNs) return;
  const int64_t c = ThreadCpuNs();
  to_->AddCpu(c - cpu_ + std::exchange(off_thread_cpu_ns, 0));
  cpu_ = c;
  wall_ = now;
}

void MapStage::Account(int n, int64_t first, int64_t t1, CpuMeter* cpu, double* map_ns,
                       TraceTrack* track) {
  LoaderShared& sh = *core_->shared;
  const int64_t t2 = NowNs();
  const double per_sample = double(t2 - t1) / n;
  *map_ns = *map_ns == 0 ? per_sample : 0.8 * *map_ns + 0.2 * per_sample;
  sh.UpdateChunk(*map_ns);
  cpu->Read(t2);
  sh.counters.map.AddBusy(t2 - t1);
  sh.counters.map.items.fetch_add(n, std::memory_order_relaxed);
  track->Span(TraceTrack::Kind::kDecode, t1, t2, first);
}

void MapStage::InlineLoop(int id, SampleTransform::WorkerState* state,
                          std::vector<uint8_t>* scratch, TraceTrack* track) {
  LoaderShared& sh = *core_->shared;
  ReadItem item;      // this worker's own: nothing is handed off
  double map_ns = 0;  // smoothed time per sample (reads included)
  CpuMeter cpu(&sh.counters.map);
  while (core_->ParkWhileSurplus(id, sh.tuning.workers)) {
    int64_t seq = 0, end = 0;
    if (!read_->Claim(&seq, &end)) return;
    const int64_t t0 = NowNs();
    if (!ring_->WaitAdmitted(seq / core_->batch_size) ||
        !ring_->EnsureOpen(seq / core_->batch_size)) {
      return;
    }
    const int64_t t1 = NowNs();
    sh.counters.map.AddWait(t1 - t0);
    item.Fill(*core_, seq, end);
    for (int k = 0; k < item.count; ++k) read_->ReadInline(&item.entries[size_t(k)]);
    const int64_t first = item.first().sample;
    ProcessItem(&item, state, scratch);
    Account(item.count, first, t1, &cpu, &map_ns, track);
  }
}

void MapStage::ProcessItem(ReadItem* item, SampleTransform::WorkerState* state,
                           std::vector<uint8_t>* scratch) {
  const bool inline_reads = core_->shared->inline_reads;
  LoaderShared& sh = *core_->shared;
  // Every entry of an item is in the same batch.
  const int64_t b = item->first().seq / core_->batch_size;
  BatchRing::InFlight& e = ring_->at(b);
  internal::BatchSlot* slot = e.slot.get();  // null: the batch failed already (no memory)
  int64_t completed = 0;
  for (int k = 0; k < item->count; ++k) {
    ReadEntry& entry = item->entries[size_t(k)];
    const int64_t pos = entry.seq % core_->batch_size;
    absl::Status st;
  map_entry:  // again after an inline replacement read
    if (slot == nullptr) {
      st = absl::OkStatus();
    } else if (!entry.status.ok()) {
      // A copy: see BatchRing::Fail.
      st = absl::Status(entry.status.code(), entry.status.message());
    } else {
      SampleWriter writer = sh.layout->Writer(slot, pos);
      const SampleContext ctx(sh.options.seed(), core_->epoch, entry.sample,
                              core_->Position(entry.seq));
      st = SafeApply(*sh.transform, entry.record, ctx, state, writer);
      if (st.ok()) st = internal::SlotLayout::CheckWritten(writer);
    }
    if (!st.ok()) {
      const std::string name = sh.dataset->Describe(entry.sample);
      const bool replaceable = !IsNotReplaceable(st);
      st = WithName(st, name);
      if (replaceable && replacement_->MarkBad(entry.sample)) {
        // The cause without the name (st's message starts with it): stats() shows both.
        absl::string_view cause = st.message();
        if (absl::StartsWith(cause, name)) cause.remove_prefix(name.size());
        if (absl::StartsWith(cause, ": ")) cause.remove_prefix(2);
        core_->RecordError(SampleError{name, std::string(cause), entry.sample, core_->epoch});
      }
      if (replaceable && sh.options.on_error() == OnError::kSkip &&
          entry.attempt < Replacement::kAttempts) {
        // Replace it by another sample of this epoch, chosen from (seed, epoch, position,
        // attempt) so the run stays reproducible. The read goes through the retry reader,
        // under the read timeout like every read.
        const int64_t r =
            replacement_->Pick(core_->Position(entry.seq), entry.sample, &entry.attempt);
        if (r >= 0 && inline_reads) {  // no read stage: read the replacement here
          entry.sample = r;
          read_->ReadInline(&entry);
          goto map_entry;
        }
        if (r >= 0) {
          ReadItem* retry = item->retry ? item : queues_->AcquireRetry();
          if (retry != item) {
            retry->Resize(1);
            ReadEntry& moved = retry->first();
            moved.seq = entry.seq;
            moved.attempt = entry.attempt;
            std::swap(moved.record, entry.record);
          }
          retry->first().sample = r;
          retry->first().status = absl::OkStatus();
          if (retry == item) {
            // A retry item is the only entry: it goes on, and this worker is done with it.
            if (completed > 0) ring_->CompleteSamples(e, completed, scratch);
            read_->Resubmit(retry);
            return;
          }
          read_->Resubmit(retry);
          continue;  // its position completes when the replacement is mapped
        }
      }
    }
    if (slot != nullptr) {
      slot->indices[size_t(pos)] = entry.sample;
      if (!st.ok()) {
        internal::ClearSample(slot, pos);
        ring_->Fail(e, pos, st);
      }
    }
    ++completed;
  }
  // Give the item back before completing: once the batch completes the epoch may end, and the
  // item must be in its queue by then. (Inline, the item is the worker's own.)
  if (item->retry) {
    queues_->ReleaseRetry(item);
  } else if (!inline_reads) {
    queues_->free.push(item);
  }
  if (completed > 0) ring_->CompleteSamples(e, completed, scratch);
}

}  // namespace feedline
