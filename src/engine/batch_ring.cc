#include "engine/batch_ring.h"

#include <algorithm>
#include <chrono>
#include <new>
#include <thread>

#include "absl/strings/str_cat.h"

namespace feedline {

BatchRing::BatchRing(EpochCore* core, int64_t start_batch)
    : core_(core),
      consumed_(std::min(start_batch, core->num_batches)),
      start_batch_(std::min(start_batch, core->num_batches)),
      opened_(std::min(start_batch, core->num_batches)),
      inflight_(new InFlight[kMaxPrefetch]) {}

bool BatchRing::WaitAdmitted(int64_t b) {
  LoaderShared& sh = *core_->shared;
  while (true) {
    const uint32_t gen = core_->wake.Load();
    if (core_->is_cancelled()) return false;
    const int64_t bound = consumed_.load(std::memory_order_acquire) + sh.tuning.prefetch.load();
    if (b < bound) {
      if (b < bound - sh.epochs.lent.load(std::memory_order_acquire)) return true;
      // Held by the slots the previous epoch's last batches keep (a head start): they come
      // back as its consumer takes them, a few per epoch; polled rather than woken across runs.
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      continue;
    }
    core_->wake.Wait(gen);
  }
}

bool BatchRing::EnsureOpen(int64_t b) {
  std::lock_guard<std::mutex> lock(open_mu_);
  while (opened_ <= b) {
    if (fed_out_) return false;
    const int64_t k = opened_;
    if (core_->feed != nullptr) {  // this batch is the feed's next one, if any is left
      const int64_t g = core_->feed->Claim(BatchFeed::kLocal);
      if (g < 0) {
        fed_out_ = true;
        return false;
      }
      core_->claimed[size_t(k)] = g;
    }
    InFlight& e = at(k);
    absl::Status error;
    try {
      e.slot = core_->shared->memory.pool->Acquire();
    } catch (const std::bad_alloc&) {
      // Pinned or plain memory ran out: the batch fails (at its turn), the process does not.
      e.slot.reset();
      error = absl::ResourceExhaustedError(absl::StrCat(
          "batch ", k, ": cannot allocate a slot of ", core_->shared->memory.pool->slot_bytes(),
          " bytes (out of host memory); lower batch_size, prefetch or memory_budget"));
    }
    e.open_ns = NowNs();
    e.count = std::min(core_->batch_size, core_->run_seq - k * core_->batch_size);
    e.remaining.store(e.count, std::memory_order_relaxed);
    e.ready.store(false, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> elock(e.mu);
      e.error = error;
      e.error_pos = error.ok() ? -1 : 0;
    }
    e.batch.store(k, std::memory_order_release);
    ++opened_;
  }
  return true;
}

void BatchRing::Fail(InFlight& e, int64_t pos, const absl::Status& st) {
  std::lock_guard<std::mutex> lock(e.mu);
  if (e.error_pos < 0 || pos < e.error_pos) {
    // A status that crosses threads is copied, never shared: its reference count lives in
    // Debian's prebuilt (uninstrumented) Abseil, where ThreadSanitizer cannot see its ordering.
    e.error = absl::Status(st.code(), st.message());
    e.error_pos = pos;
  }
}

void BatchRing::CompleteSamples(InFlight& e, int64_t n, std::vector<uint8_t>* scratch) {
  if (e.remaining.fetch_sub(n, std::memory_order_acq_rel) != n) return;
  // The last sample (the acq_rel count orders every other worker's writes before this): nobody
  // else touches the slot now. Assemble, then publish.
  if (e.slot != nullptr) internal::AssembleBatch(e.slot.get(), e.count, scratch);
  if (on_assembled_ && e.slot != nullptr) {
    bool failed;
    {
      std::lock_guard<std::mutex> lock(e.mu);
      failed = !e.error.ok();
    }
    if (!failed) on_assembled_(e.batch.load(std::memory_order_acquire), e.slot, e.count);
  }
  e.ready.store(true, std::memory_order_release);
  assembled_.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard<std::mutex> lock(done_mu_);
  done_cv_.notify_all();
}

bool BatchRing::WaitReady(int64_t b, std::chrono::nanoseconds poll) {
  std::unique_lock<std::mutex> lock(done_mu_);
  done_cv_.wait_for(lock, poll, [&] { return Ready(b) || core_->is_cancelled(); });
  return Ready(b);
}

BatchRing::Taken BatchRing::Take(int64_t b) {
  InFlight& e = at(b);
  Taken t;
  t.slot = std::move(e.slot);
  t.count = e.count;
  t.open_ns = e.open_ns;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    t.error = std::move(e.error);
    e.error = absl::OkStatus();
  }
  e.batch.store(-1, std::memory_order_relaxed);
  consumed_.store(b + 1, std::memory_order_release);
  core_->Wake();
  return t;
}

BatchRing::Peeked BatchRing::Peek(int64_t b) {
  InFlight& e = at(b);
  Peeked p;
  if (!Ready(b)) return p;  // acquire: the slot's bytes and fields below are complete
  {
    std::lock_guard<std::mutex> lock(e.mu);
    if (!e.error.ok()) return p;
  }
  p.slot = e.slot;
  p.count = e.count;
  return p;
}

int64_t BatchRing::ReadyBatches() {
  int64_t ready = 0;
  std::lock_guard<std::mutex> lock(open_mu_);
  for (int64_t k = consumed_.load(); k < opened_; ++k) {
    if (Ready(k)) ++ready;
  }
  return ready;
}

void BatchRing::NotifyConsumer() {
  std::lock_guard<std::mutex> lock(done_mu_);
  done_cv_.notify_all();
}

void BatchRing::ReleaseSlots() {
  for (int i = 0; i < kMaxPrefetch; ++i) inflight_[size_t(i)].slot.reset();
}

}  // namespace feedline
