#include "engine/bottleneck.h"

#include <algorithm>
#include <string_view>

#include "absl/strings/str_format.h"

namespace feedline {
namespace {

const StageStats* Find(const Stats& s, std::string_view name) {
  for (const StageStats& st : s.stages) {
    if (st.name == name) return &st;
  }
  return nullptr;
}

double Utilisation(const StageStats* st) {
  return st == nullptr ? 0.0 : st->busy_s / std::max(1e-9, st->busy_s + st->wait_s);
}

}  // namespace

void DiagnoseBottleneck(Stats* s) {
  const StageStats* rd = Find(*s, "read");
  const StageStats* dc = Find(*s, "map");
  const StageStats* cp = Find(*s, "copy");
  const double dec_util = Utilisation(dc);
  const double rd_util = Utilisation(rd);
  const double capacity = s->map_ms_per_sample > 0 ? 1e3 * s->workers / s->map_ms_per_sample : 0.0;
  const double copy_busy = cp != nullptr && s->elapsed_s > 0 ? cp->busy_s / s->elapsed_s : 0.0;
  if (s->batches == 0) {
    s->bottleneck = "unknown";
    s->bottleneck_reason = "no batch delivered yet";
  } else if (copy_busy >= kCopyBusyLimit) {
    s->bottleneck = "copy";
    s->bottleneck_reason = absl::StrFormat(
        "the GPU copy stream (H2D copy + conversion) was busy %.0f%% of the time, %.2f ms per "
        "batch; the consumer waited %.1f%%",
        100 * copy_busy, 1e3 * cp->busy_s / double(std::max<int64_t>(1, cp->items)),
        100 * s->consumer_wait_fraction);
  } else if (s->consumer_wait_fraction < 0.05 ||
             (s->consumer_wait_fraction < 0.25 && s->demand_samples_per_s > 0 &&
              s->demand_samples_per_s < 0.9 * capacity && dec_util < 0.8)) {
    s->bottleneck = "consumer";
    s->bottleneck_reason = absl::StrFormat(
        "the consumer waited %.1f%% of the time; it takes %.0f samples/s, %d workers can give "
        "%.0f (busy %.0f%%)",
        100 * s->consumer_wait_fraction, s->demand_samples_per_s, s->workers, capacity,
        100 * dec_util);
    if (s->consumer_cpu_s > 0 && s->consumer_run_delay_s > kSlowedConsumer * s->consumer_cpu_s) {
      // The consumer's own work was stretched: other threads held the cores it was ready for.
      absl::StrAppendFormat(
          &s->bottleneck_reason,
          "; its thread waited for a core %.0f%% as long as it ran (other threads slow it: %s)",
          100 * s->consumer_run_delay_s / s->consumer_cpu_s,
          s->worker_nice > 0 ? "other processes, the loader's workers run below it"
                             : "the loader's workers run at its priority");
    }
  } else if (dec_util < 0.6 && rd_util > 0.5) {
    s->bottleneck = "storage";
    s->bottleneck_reason = absl::StrFormat(
        "the consumer waited %.1f%%; workers idle %.0f%% of the time waiting for reads of "
        "%.1f ms each, %d reads in flight (readers busy %.0f%%)",
        100 * s->consumer_wait_fraction, 100 * (1 - dec_util), s->read_ms, s->io_depth,
        100 * rd_util);
    if (s->remote.remote) {
      absl::StrAppendFormat(&s->bottleneck_reason,
                            "; remote: %lld requests (%lld retried), %.1f ms each, %lld in "
                            "flight, %.1f MB fetched",
                            static_cast<long long>(s->remote.requests),
                            static_cast<long long>(s->remote.retries), s->remote.request_ms,
                            static_cast<long long>(s->remote.in_flight),
                            double(s->remote.bytes) / 1e6);
    }
  } else {
    s->bottleneck = "map";
    s->bottleneck_reason = absl::StrFormat(
        "the consumer waited %.1f%%; %d workers busy %.0f%%, %.2f ms per sample (%.0f samples/s "
        "at most)",
        100 * s->consumer_wait_fraction, s->workers, 100 * dec_util, s->map_ms_per_sample,
        capacity);
  }
}

}  // namespace feedline
