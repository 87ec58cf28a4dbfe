// A weighted mixture of data sets (include/feedline/mix.h).
#include "feedline/mix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "feedline/random.h"

namespace feedline {
namespace {

// Epochs longer than this are refused: the schedule holds 6 bytes per sample.
constexpr int64_t kMaxEpochSamples = int64_t{1} << 31;

// A bijection of [0, n) keyed by `key`, computed per element (no table): a 4-round Feistel
// network over the smallest even power of two >= n, walked until it lands inside [0, n) (at
// most 4n / n tries expected). Random access, so a record's place in its source's order is a
// pure function of (seed, source, cycle, draw), computed on any thread.
uint64_t Permute(uint64_t x, uint64_t n, uint64_t key) {
  if (n <= 1) return 0;
  int bits = 0;
  while (bits < 64 && (uint64_t{1} << bits) < n) ++bits;
  const int h = (bits + 1) / 2;
  const uint64_t mask = (uint64_t{1} << h) - 1;
  do {
    uint64_t l = x >> h, r = x & mask;
    for (uint64_t round = 0; round < 4; ++round) {
      const uint64_t t = l ^ (Mix64(r ^ key ^ (round * 0x9E3779B97F4A7C15ULL)) & mask);
      l = r;
      r = t;
    }
    x = (l << h) | r;
  } while (x >= n);
  return x;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Mix>> Mix::Create(std::vector<MixSource> sources,
                                                 MixOptions options) {
  if (sources.empty()) return absl::InvalidArgumentError("mix: no sources");
  if (sources.size() > 0xFFFF) return absl::InvalidArgumentError("mix: more than 65535 sources");
  std::shared_ptr<Mix> m(new Mix());
  double total = 0;
  m->offsets_.push_back(0);
  for (size_t s = 0; s < sources.size(); ++s) {
    const MixSource& src = sources[s];
    if (src.dataset == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("mix: source ", s, " is null"));
    }
    if (!(src.weight > 0) || !std::isfinite(src.weight)) {
      return absl::InvalidArgumentError(
          absl::StrCat("mix: source ", s, ": weight must be > 0 and finite, got ", src.weight));
    }
    const int64_t n = src.dataset->num_records();
    if (n < 1) return absl::InvalidArgumentError(absl::StrCat("mix: source ", s, " is empty"));
    if (m->offsets_.back() > std::numeric_limits<int64_t>::max() - n) {
      return absl::InvalidArgumentError("mix: too many records");
    }
    m->offsets_.push_back(m->offsets_.back() + n);
    total += src.weight;
    m->sources_.push_back(src.dataset);
  }
  for (const MixSource& src : sources) m->weights_.push_back(src.weight / total);
  // The epoch's length.
  double samples = 0;
  if (options.samples_per_epoch > 0) {
    samples = double(options.samples_per_epoch);
  } else {
    samples = options.end == MixOptions::End::kFirstSource ? 1e300 : 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      const double n = double(m->offsets_[s + 1] - m->offsets_[s]);
      samples = options.end == MixOptions::End::kFirstSource
                    ? std::min(samples, std::floor(n / m->weights_[s]))
                    : std::max(samples, std::ceil(n / m->weights_[s]));
    }
    samples = std::max(samples, 1.0);
  }
  if (samples > double(kMaxEpochSamples)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mix: an epoch of ", samples, " samples (more than 2^31): set samples_per_epoch"));
  }
  m->epoch_samples_ = int64_t(samples);
  // The schedule: sample j goes to the source furthest behind its share (stride scheduling);
  // every source's count stays within one sample of its share at every prefix.
  const size_t S = sources.size();
  m->schedule_.resize(size_t(m->epoch_samples_));
  m->slot_.resize(size_t(m->epoch_samples_));
  std::vector<int64_t> count(S, 0);
  for (int64_t j = 0; j < m->epoch_samples_; ++j) {
    size_t best = 0;
    double behind = -1e300;
    for (size_t s = 0; s < S; ++s) {
      const double d = double(j + 1) * m->weights_[s] - double(count[s]);
      if (d > behind) {
        behind = d;
        best = s;
      }
    }
    m->schedule_[size_t(j)] = uint16_t(best);
    m->slot_[size_t(j)] = uint32_t(count[best]++);
  }
  m->per_epoch_ = count;
  m->options_ = options;
  // Fingerprint: the sources, the weights, the epoch's layout and the seed (the records an
  // epoch reads depend on all of them).
  uint64_t fp = Mix64(0x6d6978 ^ options.seed);
  for (size_t s = 0; s < S; ++s) {
    uint64_t w;
    std::memcpy(&w, &m->weights_[s], sizeof w);
    fp = Mix64(fp ^ m->sources_[s]->Fingerprint());
    fp = Mix64(fp ^ w);
  }
  fp = Mix64(fp ^ uint64_t(m->epoch_samples_) ^ (options.shuffle ? 1u : 0u));
  m->fingerprint_ = fp;
  m->reads_.reset(new std::atomic<int64_t>[S]);
  for (size_t s = 0; s < S; ++s) m->reads_[s].store(0);
  return m;
}

void Mix::MapEpoch(int64_t epoch, std::vector<int64_t>* order) const {
  for (int64_t& j : *order) {
    const size_t s = schedule_[size_t(j)];
    const uint64_t n = uint64_t(offsets_[s + 1] - offsets_[s]);
    // The source's draw number, counted over the epochs: its reads go on where the last epoch
    // stopped; each pass over its records (a cycle) in a permutation of its own.
    const unsigned __int128 draw =
        static_cast<unsigned __int128>(uint64_t(epoch)) * uint64_t(per_epoch_[s]) +
        slot_[size_t(j)];
    const uint64_t cycle = uint64_t(draw / n), within = uint64_t(draw % n);
    const uint64_t local =
        options_.shuffle ? Permute(within, n, SampleRng(options_.seed, cycle, s, kRngMix).Next())
                         : within;
    j = offsets_[s] + int64_t(local);
  }
}

int Mix::source(int64_t record) const {
  return int(std::upper_bound(offsets_.begin(), offsets_.end(), record) - offsets_.begin()) - 1;
}

absl::Status Mix::Read(int64_t record, Record* out) const {
  const int s = source(record);
  if (s < 0 || s >= num_sources()) {
    return absl::OutOfRangeError(absl::StrCat("mix: record ", record, " out of range"));
  }
  reads_[size_t(s)].fetch_add(1, std::memory_order_relaxed);
  return sources_[size_t(s)]->Read(record - offsets_[size_t(s)], out);
}

bool Mix::async_reads() const {
  return std::any_of(sources_.begin(), sources_.end(),
                     [](const auto& d) { return d->async_reads(); });
}

void Mix::ReadAsync(int64_t record, Record* out, std::function<void(absl::Status)> done) const {
  const int s = source(record);
  if (s < 0 || s >= num_sources()) {
    done(absl::OutOfRangeError(absl::StrCat("mix: record ", record, " out of range")));
    return;
  }
  reads_[size_t(s)].fetch_add(1, std::memory_order_relaxed);
  sources_[size_t(s)]->ReadAsync(record - offsets_[size_t(s)], out, std::move(done));
}

std::string Mix::Describe(int64_t record) const {
  const int s = source(record);
  if (s < 0 || s >= num_sources()) return absl::StrCat("sample ", record);
  return sources_[size_t(s)]->Describe(record - offsets_[size_t(s)]);
}

namespace {

class PerSource final : public SampleTransform {
 public:
  PerSource(std::shared_ptr<const Mix> mix,
            std::vector<std::shared_ptr<const SampleTransform>> transforms)
      : mix_(std::move(mix)), transforms_(std::move(transforms)) {}

  const Schema& schema() const override { return transforms_[0]->schema(); }

  struct State : WorkerState {
    std::vector<std::unique_ptr<WorkerState>> of;  // each source's, made at its first sample
    std::vector<bool> made;
  };
  std::unique_ptr<WorkerState> NewWorkerState() const override {
    auto st = std::make_unique<State>();
    st->of.resize(transforms_.size());
    st->made.assign(transforms_.size(), false);
    return st;
  }

  absl::Status Apply(const Record& record, const SampleContext& ctx, WorkerState* state,
                     SampleWriter& out) const override {
    const int s = mix_->source(ctx.index());
    if (s < 0 || s >= int(transforms_.size())) {
      return absl::OutOfRangeError(absl::StrCat("mix: record ", ctx.index(), " out of range"));
    }
    WorkerState* own = nullptr;
    if (auto* st = static_cast<State*>(state); st != nullptr) {
      if (!st->made[size_t(s)]) {
        st->of[size_t(s)] = transforms_[size_t(s)]->NewWorkerState();
        st->made[size_t(s)] = st->of[size_t(s)] != nullptr;  // else asked again next time
      }
      own = st->of[size_t(s)].get();
    }
    const uint64_t seed = s == 0 ? ctx.seed() : Mix64(ctx.seed() ^ Mix64(0x736f75726365ULL + s));
    const SampleContext local(seed, ctx.epoch(), ctx.index() - mix_->offset(s), ctx.position());
    return transforms_[size_t(s)]->Apply(record, local, own, out);
  }

  bool SkipsRead(int64_t index) const override {
    const int s = mix_->source(index);
    return s >= 0 && s < int(transforms_.size()) &&
           transforms_[size_t(s)]->SkipsRead(index - mix_->offset(s));
  }
  bool WholeBatches() const override { return Any(&SampleTransform::WholeBatches); }
  bool SharesConsumerLocks() const override { return Any(&SampleTransform::SharesConsumerLocks); }
  bool MayStartAhead() const override {
    return !Any([](const SampleTransform& t) { return !t.MayStartAhead(); });
  }
  bool MayStartEpoch(int64_t epoch) const override {
    return !Any([epoch](const SampleTransform& t) { return !t.MayStartEpoch(epoch); });
  }
  bool ReadsOptions(OptionGroup group) const override {
    return Any([group](const SampleTransform& t) { return t.ReadsOptions(group); });
  }
  std::vector<DeviceConversion> DeviceConversions() const override {
    return transforms_[0]->DeviceConversions();  // the same for every source (checked)
  }
  // The sources' counters summed; one named "first_..." is a record index (-1: none): the
  // lowest over the sources, as the mixture's record index.
  std::vector<std::pair<std::string, int64_t>> Counters() const override {
    std::vector<std::pair<std::string, int64_t>> sum;
    for (size_t s = 0; s < transforms_.size(); ++s) {
      for (std::pair<std::string, int64_t> counter : transforms_[s]->Counters()) {
        const bool index = counter.first.rfind("first_", 0) == 0;
        if (index && counter.second >= 0) counter.second += mix_->offset(int(s));
        auto it = std::find_if(sum.begin(), sum.end(),
                               [&](const auto& x) { return x.first == counter.first; });
        if (it == sum.end()) {
          sum.push_back(counter);
        } else if (!index) {
          it->second += counter.second;
        } else if (counter.second >= 0 && (it->second < 0 || counter.second < it->second)) {
          it->second = counter.second;
        }
      }
    }
    return sum;
  }

 private:
  template <typename F>
  bool Any(F f) const {
    for (const auto& t : transforms_) {
      if (std::invoke(f, *t)) return true;
    }
    return false;
  }

  const std::shared_ptr<const Mix> mix_;
  const std::vector<std::shared_ptr<const SampleTransform>> transforms_;
};

// The first difference between two schemas, or "".
std::string SchemaDifference(const Schema& a, const Schema& b) {
  if (a.size() != b.size()) return absl::StrCat(a.size(), " fields against ", b.size());
  for (int i = 0; i < a.size(); ++i) {
    const Field &x = a.field(i), &y = b.field(i);
    bool same = x.name() == y.name() && x.dtype() == y.dtype() && x.rank() == y.rank() &&
                x.collate() == y.collate() && x.pad_value() == y.pad_value();
    for (int d = 0; same && d < x.rank(); ++d) {
      same = x.shape()[size_t(d)].size == y.shape()[size_t(d)].size &&
             x.shape()[size_t(d)].variable == y.shape()[size_t(d)].variable;
    }
    if (!same) return absl::StrCat("field ", i, " (", x.name(), " / ", y.name(), ")");
  }
  return "";
}

}  // namespace

absl::StatusOr<std::shared_ptr<SampleTransform>> PerSourceTransform(
    std::shared_ptr<const Mix> mix,
    std::vector<std::shared_ptr<const SampleTransform>> transforms) {
  if (mix == nullptr) return absl::InvalidArgumentError("mix: a mixture is required");
  if (int(transforms.size()) != mix->num_sources()) {
    return absl::InvalidArgumentError(absl::StrCat("transforms: ", transforms.size(),
                                                   " for a mixture of ", mix->num_sources(),
                                                   " sources (one each)"));
  }
  for (size_t s = 0; s < transforms.size(); ++s) {
    if (transforms[s] == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("transforms[", s, "]: missing"));
    }
    if (s == 0) continue;
    if (std::string d = SchemaDifference(transforms[0]->schema(), transforms[s]->schema());
        !d.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transforms[", s, "]: its samples differ from source 0's: ", d,
                       " (the sources of one loader must make samples of the same schema)"));
    }
    if (transforms[s]->DeviceConversions().size() != transforms[0]->DeviceConversions().size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("transforms[", s, "]: other device conversions than source 0's"));
    }
  }
  return std::shared_ptr<SampleTransform>(
      std::make_shared<PerSource>(std::move(mix), std::move(transforms)));
}

RemoteStats Mix::remote_stats() const {
  RemoteStats r;
  double ms_weighted = 0;
  int64_t ok = 0;
  for (const auto& d : sources_) {
    const RemoteStats x = d->remote_stats();
    r.remote = r.remote || x.remote;
    r.requests += x.requests;
    r.retries += x.retries;
    r.failures += x.failures;
    r.bytes += x.bytes;
    r.in_flight += x.in_flight;
    r.damaged_copies += x.damaged_copies;
    ms_weighted += x.request_ms * double(x.requests - x.failures);
    ok += x.requests - x.failures;
  }
  r.request_ms = ok > 0 ? ms_weighted / double(ok) : 0;
  return r;
}

}  // namespace feedline
