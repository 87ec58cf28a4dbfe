// A user's own data set and transform through an installed feedline: several fields, one of
// variable length (padded, with lengths), computed from a record the data set reads. Checks
// every value and prints "samples <N> batches <M> ok".
#include <feedline/feedline.h>

#include <cstdio>
#include <memory>
#include <string>

namespace {

// Record i: the text "w0 w1 ... w{i % 12}" (1 to 12 words) and label i % 3.
class Sentences final : public feedline::Dataset {
 public:
  int64_t size() const override { return 50; }
  absl::Status Read(int64_t index, feedline::Record* record) const override {
    std::string text;
    for (int64_t w = 0; w <= index % 12; ++w) text += "w" + std::to_string(w) + " ";
    record->bytes.assign(text.begin(), text.end());
    record->label = index % 3;
    return absl::OkStatus();
  }
  uint64_t Fingerprint() const override { return 50; }
};

// "ids": int32 [<=12], one id per word (its byte offset); "weights": float32 [3]; "label".
class Tokenize final : public feedline::SampleTransform {
 public:
  const feedline::Schema& schema() const override { return schema_; }
  absl::Status Apply(const feedline::Record& record, const feedline::SampleContext& ctx,
                     WorkerState*, feedline::SampleWriter& out) const override {
    int32_t ids[12];
    int64_t n = 0;
    for (size_t i = 0; i < record.bytes.size(); ++i) {
      if (record.bytes[i] == 'w') {
        if (n == 12) return absl::InvalidArgumentError("more than 12 words");
        ids[n++] = int32_t(i);
      }
    }
    if (absl::Status s = out.Write(0, {n}, ids); !s.ok()) return s;
    float* w = out.Fixed<float>(1);
    w[0] = float(ctx.index());
    w[1] = float(n);
    w[2] = float(ctx.rng(1).Uniform());
    *out.Fixed<int64_t>(2) = record.label;
    return absl::OkStatus();
  }

 private:
  feedline::Schema schema_{
      feedline::Field("ids", feedline::DType::kInt32, {feedline::Dim::UpTo(12)}).pad_value(-1),
      feedline::Field("weights", feedline::DType::kFloat32, {3}),
      feedline::Field("label", feedline::DType::kInt64, {})};
};

}  // namespace

int main() {
  auto loader =
      feedline::Loader::Create(std::make_shared<Sentences>(), std::make_shared<Tokenize>(),
                               feedline::LoaderOptions().batch_size(8).workers(2));
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 1;
  }
  long samples = 0, batches = 0;
  for (absl::StatusOr<feedline::Batch>& batch : **loader) {
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
      return 1;
    }
    const feedline::TensorView ids = batch->field("ids");
    const auto* w = static_cast<const float*>(batch->field("weights").data);
    const auto* label = static_cast<const int64_t*>(batch->field("label").data);
    for (int64_t i = 0; i < batch->size(); ++i) {
      const int64_t index = batch->indices()[i];
      const int64_t words = 1 + index % 12;
      const auto* row = static_cast<const int32_t*>(ids.data) + i * ids.shape[1];
      bool good = ids.lengths[i] == words && w[i * 3] == float(index) && label[i] == index % 3;
      for (int64_t k = 0; k < ids.shape[1]; ++k) {
        good = good && (k < words ? row[k] >= 0 : row[k] == -1);
      }
      if (!good) {
        std::fprintf(stderr, "sample %lld: wrong values\n", static_cast<long long>(index));
        return 1;
      }
    }
    samples += long(batch->size());
    ++batches;
  }
  std::printf("samples %ld batches %ld ok\n", samples, batches);
  return 0;
}
