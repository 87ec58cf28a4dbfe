#include "engine/epoch_run.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/fork_generation.h"

namespace feedline {

EpochRun::EpochRun(std::shared_ptr<LoaderShared> shared, int64_t epoch, int64_t start_batch,
                   bool head_start, int64_t skip, std::vector<int64_t> selection,
                   std::shared_ptr<BatchFeed> feed)
    : core_(std::move(shared), epoch, head_start, skip, std::move(selection), std::move(feed)),
      ring_(&core_, start_batch),
      replacement_(&core_),
      read_(&core_, &ring_, &queues_, std::min(start_batch * core_.batch_size, core_.run_seq)),
      map_(&core_, &ring_, &queues_, &read_, &replacement_),
      tuning_(&core_, &ring_, &queues_, &read_,
              [this](const TunerSettings& from, const TunerSettings& to) {
                if (to.io_depth != from.io_depth) SetIoDepth(to.io_depth);
                if (to.workers != from.workers) SetWorkers(to.workers);
                if (to.prefetch != from.prefetch) SetPrefetch(to.prefetch);
              }),
      fork_generation_(ForkGeneration()),
      adopted_(!head_start) {
  LoaderShared& sh = *core_.shared;
  int64_t expected = 0;
  sh.counters.start_ns.compare_exchange_strong(expected, NowNs());
  if (!head_start && core_.selection.empty() && core_.feed == nullptr) {
    std::lock_guard<std::mutex> lock(sh.epochs.mu);
    sh.epochs.active = this;
  }
  MarkReturn();
  consumer_track_ = sh.trace->Track("consumer");
  batch_track_ = sh.trace->Track("batches (open -> handed out)");
  if (sh.device_stage != nullptr) {
    ring_.set_on_assembled([this](int64_t j, const std::shared_ptr<internal::BatchSlot>& slot,
                                  int64_t n) { OnAssembled(j, slot, n); });
  }
  SetIoDepth(sh.tuning.io_depth.load());
  SetWorkers(sh.tuning.workers.load());
  // A head start's tuning waits for its adoption: until then the consumer is in the epoch
  // before, or away (validation), and its figures would tell the tuner nothing of this one.
  if (!head_start) tuning_.Start();
}

void EpochRun::Adopt() {
  adopted_.store(true, std::memory_order_release);
  core_.ReleaseErrors();
  MarkReturn();  // the consumer's time before this epoch was counted by the one before
  tuning_.Start();
}

void EpochHandoff::RunDeleter::operator()(EpochRun* run) const {
  if (run->forked()) return;  // a forked copy: leaked (see EpochRun::forked)
  delete run;
}

EpochRun::~EpochRun() {
  Shutdown();  // the workers, which queue copies too, are gone after it
  {
    std::lock_guard<std::mutex> lock(early_mu_);
    early_.clear();
  }
  LoaderShared& sh = *core_.shared;
  std::lock_guard<std::mutex> lock(sh.epochs.mu);
  if (sh.epochs.active == this) {
    sh.epochs.active = nullptr;
    const int64_t done = ring_.consumed();
    if (done < core_.num_batches) {
      sh.epochs.has_partial = true;
      sh.epochs.partial_epoch = core_.epoch;
      sh.epochs.partial_batches = done;
      sh.epochs.partial_skip = core_.skip;
    }
  }
}

void EpochRun::MarkReturn() {
  last_return_ns_ = NowNs();
  returned_to_ = ThreadSchedStat(&returned_cpu_ns_, &returned_delay_ns_) ? gettid() : -1;
}

bool EpochRun::forked() const { return fork_generation_ != ForkGeneration(); }

void EpochRun::SetWorkers(int n) {
  n = std::max(1, n);
  core_.shared->tuning.workers.store(n);
  map_.SetThreads(n);
  core_.Wake();
}

void EpochRun::SetIoDepth(int n) {
  n = std::max(1, n);
  core_.shared->tuning.io_depth.store(n);
  read_.SetThreads(n);
  core_.Wake();
}

void EpochRun::SetPrefetch(int n) {
  n = std::clamp(n, 1, kMaxPrefetch);
  core_.shared->tuning.prefetch.store(n);
  core_.shared->memory.KeepSlots(n);
  core_.Wake();
}

absl::Status EpochRun::TooManyErrors() {
  LoaderShared& sh = *core_.shared;
  const int64_t max = sh.options.max_errors();
  if (max <= 0 || sh.errors.count() <= max) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat(sh.errors.count(), " samples failed, more than max_errors=", max,
                   " (a broken data set or storage?); the first: ", sh.errors.FirstText()));
}

absl::StatusOr<Batch> EpochRun::Next(const std::function<absl::Status()>& interrupted,
                                     absl::Duration poll) {
  LoaderShared& sh = *core_.shared;
  const int64_t entered = NowNs();
  sh.counters.consumer.AddBusy(entered - last_return_ns_);
  if (const pid_t tid = gettid(); tid == returned_to_) {
    // The consumer's step since the last batch: its CPU, and its waits for a core.
    int64_t cpu = 0, delay = 0;
    if (ThreadSchedStat(&cpu, &delay)) {
      sh.counters.consumer_cpu_ns.fetch_add(cpu - returned_cpu_ns_, std::memory_order_relaxed);
      sh.counters.consumer_run_delay_ns.fetch_add(delay - returned_delay_ns_,
                                                  std::memory_order_relaxed);
    }
  }
  // The step just ended worked on the batch returned last: its samples go with that busy time
  // (counted here, not at the return, so that any window sees matching samples and time).
  sh.counters.stepped_samples.fetch_add(held_samples_, std::memory_order_relaxed);
  held_samples_ = 0;
  const int64_t b = ring_.consumed();
  if (b >= core_.num_batches) {
    Shutdown();
    MarkReturn();
    return absl::OutOfRangeError(absl::StrCat("end of epoch ", core_.epoch));
  }
  if (handout_cancelled_.load()) return absl::CancelledError("the epoch was cancelled");
  const auto poll_ns = std::chrono::nanoseconds(absl::ToInt64Nanoseconds(poll));
  while (!ring_.Ready(b)) {
    if (handout_cancelled_.load()) return absl::CancelledError("the epoch was cancelled");
    if (core_.is_cancelled()) {  // stages stopped early only once every batch was made
      return absl::InternalError(absl::StrCat("batch ", b, " of epoch ", core_.epoch,
                                              " was never made (the stages had stopped)"));
    }
    if (absl::Status flood = TooManyErrors(); !flood.ok()) {
      MarkReturn();
      return flood;
    }
    if (!ring_.WaitReady(b, poll_ns) && interrupted && !handout_cancelled_.load()) {
      if (absl::Status s = interrupted(); !s.ok()) {
        sh.counters.AddConsumerWait(b, NowNs() - entered);
        MarkReturn();
        return s;
      }
    }
  }
  const int64_t got = NowNs();
  sh.counters.AddConsumerWait(b, got - entered);
  BatchRing::Taken taken = ring_.Take(b);
  ReturnLent(/*all=*/false);
  consumer_track_->Span(TraceTrack::Kind::kWait, entered, got, b);
  batch_track_->Span(TraceTrack::Kind::kBatch, taken.open_ns, got, b);
  Batch batch;
  if (taken.slot != nullptr) sh.memory.pool->MarkHandedOut(taken.slot.get());
  batch.slot_ = std::move(taken.slot);
  batch.size_ = taken.count;
  sh.counters.consumer.AddItem();
  sh.counters.batches.fetch_add(1, std::memory_order_relaxed);
  sh.counters.samples.fetch_add(batch.size_, std::memory_order_relaxed);
  MaybeStartNext();  // (before Shutdown, which ends the hand-out)
  if (b + 1 == core_.num_batches) Shutdown();  // free the threads as soon as the epoch is done
  held_samples_ = batch.size_;
  MarkReturn();
  if (!taken.error.ok()) return taken.error;
  batch.index_ = core_.Batch(b);
  batch.epoch_ = core_.epoch;
  if (sh.device_stage != nullptr) {
    absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> on_device =
        OnDevice(b, batch.slot_, batch.size_);
    if (!on_device.ok()) return on_device.status();
    batch.device_batch_ = *std::move(on_device);
    batch.device_ = sh.device;
    batch.slot_.reset();  // the device batch holds it until the copy from it is done
    SubmitAhead(b);
  }
  return batch;
}

absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> EpochRun::OnDevice(
    int64_t b, std::shared_ptr<internal::BatchSlot> slot, int64_t n) {
  std::lock_guard<std::mutex> lock(early_mu_);
  early_.erase(early_.begin(), early_.lower_bound(b));
  if (auto it = early_.find(b); it != early_.end()) {
    std::shared_ptr<internal::DeviceBatch> d = std::move(it->second);
    early_.erase(it);
    return d;
  }
  return internal::SubmitSlot(*core_.shared->device_stage, std::move(slot), n);
}

bool EpochRun::QueueCopy(int64_t j, const std::shared_ptr<internal::BatchSlot>& slot, int64_t n) {
  absl::StatusOr<std::shared_ptr<internal::DeviceBatch>> d =
      internal::SubmitSlot(*core_.shared->device_stage, slot, n);
  if (!d.ok()) return false;  // submitted again when taken, which returns the error then
  early_.emplace(j, *std::move(d));
  return true;
}

void EpochRun::SubmitAhead(int64_t b) {
  std::lock_guard<std::mutex> lock(early_mu_);
  for (int64_t next = b + 1; next <= b + kDeviceLookahead && next < core_.num_batches; ++next) {
    if (early_.count(next) != 0) continue;  // its worker queued it
    BatchRing::Peeked p = ring_.Peek(next);
    if (p.slot == nullptr) continue;  // not ready (its worker queues it), or failed
    if (!QueueCopy(next, p.slot, p.count)) return;
  }
}

void EpochRun::OnAssembled(int64_t j, const std::shared_ptr<internal::BatchSlot>& slot, int64_t n) {
  // A head start copies nothing before it is the loader's epoch: the previous epoch's copies
  // may still be queued, and the device stage serves one epoch at a time.
  if (!adopted_.load(std::memory_order_acquire)) return;
  // Beyond the window: the consumer queues it when it takes batch j - kDeviceLookahead. (Not
  // yet published, j cannot have been queued by the consumer.)
  if (j > ring_.consumed() + kDeviceLookahead || core_.is_cancelled()) return;
  std::lock_guard<std::mutex> lock(early_mu_);
  QueueCopy(j, slot, n);
}

void EpochRun::Cancel() {
  handout_cancelled_.store(true);
  ReturnLent(/*all=*/true);  // this epoch's batches will not be taken
  StopStageThreads();
  ring_.NotifyConsumer();
}

void EpochRun::StopStageThreads() {
  if (core_.cancelled.exchange(true)) return;
  const int threads = read_.threads() + map_.threads();
  for (int i = 0; i < threads; ++i) {
    queues_.ready.push(nullptr);
    queues_.free.push(nullptr);
  }
  queues_.retry.push(nullptr);
  core_.Wake();
  ring_.NotifyConsumer();
}

void EpochRun::ReturnLent(bool all) {
  int n = lent_.load();
  while (n > 0 && !lent_.compare_exchange_weak(n, all ? 0 : n - 1)) {
  }
  if (n > 0) core_.shared->epochs.lent.fetch_sub(all ? n : 1, std::memory_order_acq_rel);
}

void EpochRun::StopStages() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (stages_stopped_) return;
    stages_stopped_ = true;
  }
  StopStageThreads();
  std::vector<std::thread> threads;
  read_.Stop(&threads);
  tuning_.Stop(&threads);
  for (auto& t : threads) t.join();
  map_.Stop();  // the workers are the loader's: this epoch's loops on them return
  // Read buffers are freed with the run; keep the accounting honest.
  queues_.DropBuffers();
  core_.shared->counters.read_buffer_bytes.fetch_sub(read_.TakeBufferBytes(),
                                                     std::memory_order_relaxed);
}

void EpochRun::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  Cancel();
  StopStages();
  // Slots of batches that were opened but never handed out go back to the pool.
  ring_.ReleaseSlots();
}

void EpochRun::MaybeStartNext() {
  LoaderShared& sh = *core_.shared;
  if (next_tried_ || !sh.options.epoch_head_start() || !ring_.AllAssembled()) return;
  const int64_t next = core_.epoch + 1;
  if (!sh.transform->MayStartEpoch(next)) return;  // asked again at the next batch
  next_tried_ = true;
  auto wanted = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(sh.epochs.mu) {
    return !sh.epochs.loader_gone && sh.epochs.head_start == nullptr && sh.epochs.active == this &&
           sh.epochs.next_epoch == next && sh.epochs.next_start_batch == 0 &&
           sh.epochs.next_skip == 0 && !handout_cancelled_.load();
  };
  {
    std::lock_guard<std::mutex> lock(sh.epochs.mu);
    if (!wanted()) return;
  }
  // Every batch is made: the workers are idle, and go on with the next epoch. The slots of the
  // batches not yet taken are lent: the head start's ring admits only what is left.
  StopStages();
  const int lent = int(std::max<int64_t>(0, core_.num_batches - ring_.consumed()));
  lent_.store(lent);
  sh.epochs.lent.fetch_add(lent, std::memory_order_acq_rel);
  std::unique_ptr<EpochRun, EpochHandoff::RunDeleter> run(
      new EpochRun(core_.shared, next, 0, /*head_start=*/true));
  {
    std::lock_guard<std::mutex> lock(sh.epochs.mu);
    if (wanted()) {
      sh.epochs.head_start = std::move(run);
      return;
    }
  }
  run.reset();  // the loader was told another epoch meanwhile
}

}  // namespace feedline
