#include "engine/tuning_loop.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "absl/strings/str_format.h"

namespace feedline {

void TuningLoop::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void TuningLoop::Stop(std::vector<std::thread>* join) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  if (thread_.joinable()) join->push_back(std::move(thread_));
}

void TuningLoop::Loop() {
  constexpr auto kInterval = std::chrono::milliseconds(200);
  int64_t last = NowNs();
  last_ = ReadCounters();
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, kInterval, [this] { return core_->is_cancelled(); });
    }
    if (core_->is_cancelled()) return;
    const int64_t now = NowNs();
    if (const double timeout_ms = core_->shared->options.read_timeout_ms(); timeout_ms > 0) {
      read_->AbandonStuckReads(now - int64_t(timeout_ms * 1e6),
                               absl::StrFormat("read_timeout_ms=%g", timeout_ms).c_str());
    }
    Tick(double(now - last) * 1e-9);
    last = now;
  }
}

TuningLoop::Counters TuningLoop::ReadCounters() const {
  const LoaderShared& sh = *core_->shared;
  return Counters{.samples = sh.counters.samples.load(),
                  .consumer_busy = sh.counters.consumer.busy_ns.load(),
                  .stepped_samples = sh.counters.stepped_samples.load(),
                  .consumer_wait = sh.counters.consumer.wait_ns.load(),
                  .steady_wait = sh.counters.steady_wait_ns.load(),
                  .mapped = sh.counters.map.items.load(),
                  .map_busy = sh.counters.map.busy_ns.load(),
                  .reads = sh.counters.read.items.load(),
                  .read_busy = sh.counters.read.busy_ns.load(),
                  .map_cpu = sh.counters.map.cpu_ns.load(),
                  .consumer_cpu = sh.counters.consumer_cpu_ns.load()};
}

void TuningLoop::Tick(double interval_s) {
  LoaderShared& sh = *core_->shared;
  const Counters now = ReadCounters();
  TunerSample sample;
  sample.interval_s = interval_s;
  sample.samples_consumed = now.samples - last_.samples;
  sample.consumer_busy_s = double(now.consumer_busy - last_.consumer_busy) * 1e-9;
  sample.stepped_samples = now.stepped_samples - last_.stepped_samples;
  // The tuner's wait signal leaves out each epoch's first batch (filling, not jitter); the
  // timeline shows every wait.
  sample.consumer_wait_s = double(now.steady_wait - last_.steady_wait) * 1e-9;
  const double all_wait_s =
      std::min(double(now.consumer_wait - last_.consumer_wait) * 1e-9, interval_s);
  sample.mapped = now.mapped - last_.mapped;
  sample.map_busy_s = double(now.map_busy - last_.map_busy) * 1e-9;
  sample.reads = now.reads - last_.reads;
  sample.read_busy_s = double(now.read_busy - last_.read_busy) * 1e-9;
  sample.map_cpu_s = double(now.map_cpu - last_.map_cpu) * 1e-9;
  sample.consumer_cpu_s = double(now.consumer_cpu - last_.consumer_cpu) * 1e-9;
  sample.at_s = double(NowNs() - sh.counters.start_ns.load()) * 1e-9;
  last_ = now;
  // The consumer's current wait (it may be blocked right now, not yet counted).
  sample.consumer_wait_s = std::min(sample.consumer_wait_s, interval_s);

  // Queue occupancy: complete batches waiting in the ring, and reads waiting for a worker.
  const int64_t ready_batches = ring_->ReadyBatches();
  const int prefetch = sh.tuning.prefetch.load();
  const int items = std::max(1, queues_->created.load());
  sh.counters.ring_fill_milli.fetch_add(1000 * ready_batches / std::max(1, prefetch));
  sh.counters.read_fill_milli.fetch_add(
      1000 * std::min<int64_t>(items, std::max<int64_t>(0, queues_->ready.size())) / items);
  sh.counters.fill_samples.fetch_add(1);

  const TunerSettings current{sh.tuning.workers.load(), sh.tuning.io_depth.load(), prefetch};
  TunerSettings applied = current;
  std::string reason;
  const double rate = double(sample.samples_consumed) / std::max(1e-9, interval_s);
  {
    std::lock_guard<std::mutex> lock(sh.tuner.mu);
    if (sh.tuner.model) {
      // The budget bounds the ring and the reads in flight together.
      const int64_t reads = std::max<int64_t>(sh.counters.read_buffer_bytes.load(), 0);
      const int64_t per_read = std::max<int64_t>(256 << 10, reads / items);
      sh.tuner.model->set_max_prefetch(sh.memory.AutoPrefetchLimit(
          int64_t(sh.tuning.io_depth.load() + 2 * sh.tuning.workers.load()) * per_read));
      const size_t before = sh.tuner.model->decisions().size();
      applied = sh.tuner.model->Update(sample);
      if (sh.tuner.model->decisions().size() > before)
        reason = sh.tuner.model->decisions().back().reason;
    }
    if (sh.tuner.timeline.size() < TunerState::kMaxTimeline) {
      const double t = double(NowNs() - sh.counters.start_ns.load()) * 1e-9;
      sh.tuner.timeline.push_back(TimelinePoint{t, rate, all_wait_s / interval_s, applied.workers,
                                                applied.io_depth, applied.prefetch,
                                                sh.BytesInUse()});
    }
  }
  const int64_t at = NowNs();
  sh.trace->Counter("settings", at,
                    {{"workers", applied.workers},
                     {"io_depth", applied.io_depth},
                     {"prefetch", applied.prefetch}});
  sh.trace->Counter("samples/s", at, {{"samples/s", rate}});
  if (!reason.empty()) sh.trace->Instant("tune", at, reason);
  apply_(current, applied);
}

}  // namespace feedline
