#include "engine/map_stage.h"

#include <exception>
#include <memory>
#include <new>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace feedline {
namespace {

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

void MapStage::SetThreads(int n) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_ || core_->is_cancelled()) return;
  while (static_cast<int>(workers_.size()) < n) {
    const int id = static_cast<int>(workers_.size());
    workers_.emplace_back([this, id] { WorkerLoop(id); });
  }
}

int MapStage::threads() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(workers_.size());
}

void MapStage::Stop(std::vector<std::thread>* join) {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
  for (auto& t : workers_) join->push_back(std::move(t));
  workers_.clear();
}

void MapStage::WorkerLoop(int id) {
  LoaderShared& sh = *core_->shared;
  TraceTrack* track = sh.trace->Track(absl::StrCat("worker ", id));
  std::unique_ptr<SampleTransform::WorkerState> state;
  try {
    state = sh.transform->NewWorkerState();
  } catch (...) {
    state.reset();  // Apply gets null and reports what it misses
  }
  std::vector<uint8_t> scratch;  // batch assembly
  while (core_->ParkWhileSurplus(id, sh.workers)) {
    ReadItem* item = nullptr;
    const int64_t t0 = NowNs();
    queues_->ready.pop(item);
    if (item == nullptr || core_->is_cancelled()) return;
    const int64_t t1 = NowNs();
    sh.map.AddWait(t1 - t0);
    const int64_t sample = item->sample;
    const int64_t cpu0 = ThreadCpuNs();
    if (!ProcessSample(item, state.get(), &scratch)) queues_->free.push(item);  // else: retried
    const int64_t t2 = NowNs();
    sh.map.AddCpu(ThreadCpuNs() - cpu0);
    sh.map.AddBusy(t2 - t1);
    sh.map.AddItem();
    track->Span(TraceTrack::Kind::kDecode, t1, t2, sample);
  }
}

bool MapStage::ProcessSample(ReadItem* item, SampleTransform::WorkerState* state,
                             std::vector<uint8_t>* scratch) {
  LoaderShared& sh = *core_->shared;
  const int64_t b = item->seq / core_->batch_size, pos = item->seq % core_->batch_size;
  BatchRing::InFlight& e = ring_->at(b);
  internal::BatchSlot* slot = e.slot.get();  // null: the batch failed already (no memory)
  absl::Status st;
  if (slot == nullptr) {
    st = absl::OkStatus();
  } else if (!item->status.ok()) {
    st = absl::Status(item->status.code(), item->status.message());  // a copy: see BatchRing::Fail
  } else {
    SampleWriter writer = sh.layout->Writer(slot, pos);
    const SampleContext ctx(sh.options.seed(), core_->epoch, item->sample, item->seq);
    st = SafeApply(*sh.transform, item->record, ctx, state, writer);
    if (st.ok()) st = internal::SlotLayout::CheckWritten(writer);
  }
  if (!st.ok()) {
    const std::string name = sh.dataset->Describe(item->sample);
    st = WithName(st, name);
    if (replacement_->MarkBad(item->sample)) {
      sh.RecordError(SampleError{name, std::string(st.message()), item->sample, core_->epoch});
    }
    if (sh.options.on_error() == OnError::kSkip && item->attempt < Replacement::kAttempts) {
      // Replace it by another sample of this epoch, chosen from (seed, epoch, position,
      // attempt) so the run stays reproducible. The read goes through the retry reader, under
      // the read timeout like every read.
      const int64_t r = replacement_->Pick(item->seq, item->sample, &item->attempt);
      if (r >= 0) {
        item->sample = r;
        item->status = absl::OkStatus();
        read_->Resubmit(item);
        return true;
      }
    }
  }
  if (slot != nullptr) {
    slot->indices[size_t(pos)] = item->sample;
    if (!st.ok()) {
      internal::ClearSample(slot, pos);
      ring_->Fail(e, pos, st);
    }
  }
  ring_->CompleteSample(e, scratch);
  return false;
}

}  // namespace feedline
