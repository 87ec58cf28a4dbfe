// feedline — LibTorch adapter for `torch::data` datasets: a drop-in for
// `torch::data::make_data_loader(std::move(dataset), options)`.
//
//   #include <feedline/torch_data.h>
//   auto loader = feedline::torch::make_data_loader(
//       MyDataset(...).map(torch::data::transforms::Normalize<>(0.5, 0.5)),
//       torch::data::DataLoaderOptions().batch_size(64).workers(4));
//   for (feedline::torch::Batch& batch : *loader) {   // one epoch per loop, shuffled
//     Train(batch.data, batch.target);                 // [B, ...] as Stack<>() would give them
//   }
//
// torch's own spellings are taken as they are: `make_data_loader<SequentialSampler>(dataset,
// batch_size)` (or a `DataLoaderOptions`), the sampler type setting the order (RandomSampler,
// the default, shuffles; SequentialSampler keeps the data set's order; their Distributed
// variants as one replica); a dataset `.map(Stack<>())`'d (feedline stacks anyway: the Stack is
// dropped); and `for (torch::data::Example<>& batch : *loader)` (a Batch is an Example<>).
//
// Each sample's `get(i)` (through `get_batch`, so `.map(...)`ed datasets work too) runs on
// feedline's worker threads — no GIL, no Python —, and its tensors are copied once, straight
// into the batch slot: no `Stack` copy, no per-batch allocation; then the prefetch ring and, on
// a CUDA machine, the copy stage, as for images. As in `torch::data`, every worker thread has
// its own copy of the dataset (the dataset must be copyable; its `get` need not be thread-safe).
//
// Shapes: by default the shapes and dtypes of `get(0)`'s tensors are the fields' (fixed); a
// sample whose tensor differs is that sample's error (kInvalidArgument naming the sample, the
// field and both shapes), never a silent truncation. Declare variable dimensions with an
// `ExampleSpec` (`data_shape = {feedline::Dim::UpTo(512)}`): batches are then padded to their
// longest sample, with `batch.lengths` (or `batch.target_lengths`).
//
// `torch::data::DataLoaderOptions` map over: batch_size, drop_last; workers (0, torch's "in
// the main thread", means autotuned here); enforce_ordering (batches are always in order);
// max_jobs and timeout have no equivalent (the ring depth is autotuned within the memory
// budget). The order is the sampler type's (RandomSampler by default: shuffled, with feedline's
// seed). With feedline's `LoaderOptions`, SequentialSampler turns shuffling off and
// RandomSampler leaves `shuffle` as the options set it.
//
// Errors: an exception thrown by `get` (or the transforms) becomes the error of the batch the
// sample belongs to, thrown as `feedline::Error` by the iterator ("sample <i>: <what>"), and
// the epoch goes on; with `OnError::kSkip` the sample is replaced as for images.
#ifndef FEEDLINE_TORCH_DATA_H_
#define FEEDLINE_TORCH_DATA_H_

#include <torch/data/dataloader_options.h>
#include <torch/data/datasets/base.h>
#include <torch/csrc/utils/variadic.h>  // map.h uses its enable_if_t without including it
#include <torch/data/datasets/map.h>
#include <torch/data/example.h>
#include <torch/data/samplers/distributed.h>
#include <torch/data/samplers/random.h>
#include <torch/data/samplers/sequential.h>
#include <torch/data/transforms/stack.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "feedline/dataset.h"
#include "feedline/schema.h"
#include "feedline/torch.h"
#include "feedline/transform.h"

namespace feedline::torch {

// How a sample's `data` and `target` tensors map onto fields. An empty shape: the shape of
// `get(0)`'s tensor, fixed.
struct ExampleSpec {
  std::vector<Dim> data_shape;
  std::vector<Dim> target_shape;
  double data_pad_value = 0;
  double target_pad_value = 0;
};

// `options` as feedline's (see the file comment for what maps over).
LoaderOptions FromTorchOptions(const ::torch::data::DataLoaderOptions& options);

namespace detail {

// The fields "data" and "target" from the first example and the spec. Throws feedline::Error
// (kInvalidArgument) for a tensor type feedline has no dtype for, or a spec that does not fit.
Schema ExampleSchema(const at::Tensor& data, const at::Tensor& target, const ExampleSpec& spec);
// Copies `t` into field `field` of the sample (checks its dtype and shape; CPU tensors only).
absl::Status WriteTensor(const at::Tensor& t, int field, SampleWriter& out);
std::unique_ptr<Loader> CreateLoader(std::shared_ptr<const Dataset> dataset,
                                     std::shared_ptr<const SampleTransform> transform,
                                     LoaderOptions options);
uint64_t Fingerprint(const char* type_name, int64_t size);

// The user's dataset as feedline's data set: the read stage has nothing to read (get() does
// all the work, in the map stage), so records stay empty.
class EmptyRecords final : public Dataset {
 public:
  EmptyRecords(int64_t size, uint64_t fingerprint) : size_(size), fingerprint_(fingerprint) {}
  int64_t size() const override { return size_; }
  absl::Status Read(int64_t, Record* record) const override {
    record->Clear();
    return absl::OkStatus();
  }
  uint64_t Fingerprint() const override { return fingerprint_; }
  bool empty_records() const override { return true; }

 private:
  int64_t size_;
  uint64_t fingerprint_;
};

template <typename D>
std::vector<::torch::data::Example<>> GetOne(D& dataset, size_t index) {
  return dataset.get_batch(c10::ArrayRef<size_t>(&index, 1));
}

// Whether D has get(size_t) returning an Example<> (a Dataset<Self>; a MapDataset has only
// get_batch, which applies its transforms).
template <typename D, typename = void>
struct HasGet : std::false_type {};
template <typename D>
struct HasGet<D, std::void_t<decltype(std::declval<D&>().get(size_t{0}))>>
    : std::is_same<decltype(std::declval<D&>().get(size_t{0})), ::torch::data::Example<>> {};

// get(i) on a worker's own copy of the dataset, written into the slot.
template <typename D>
class ExampleTransform final : public SampleTransform {
 public:
  ExampleTransform(std::shared_ptr<const D> prototype, Schema schema)
      : prototype_(std::move(prototype)), schema_(std::move(schema)) {}
  const Schema& schema() const override { return schema_; }
  std::unique_ptr<WorkerState> NewWorkerState() const override {
    return std::make_unique<State>(*prototype_);
  }
  absl::Status Apply(const Record&, const SampleContext& ctx, WorkerState* state,
                     SampleWriter& out) const override {
    auto* own = static_cast<State*>(state);
    if (own == nullptr) return absl::InternalError("no copy of the dataset for this worker");
    if constexpr (HasGet<D>::value) {  // no vector of one example per sample
      const ::torch::data::Example<> example = own->dataset.get(size_t(ctx.index()));
      if (absl::Status s = WriteTensor(example.data, 0, out); !s.ok()) return s;
      return WriteTensor(example.target, 1, out);
    } else {
      std::vector<::torch::data::Example<>> examples = GetOne(own->dataset, size_t(ctx.index()));
      if (examples.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("get_batch of one index gave ", examples.size(), " examples"));
      }
      if (absl::Status s = WriteTensor(examples[0].data, 0, out); !s.ok()) return s;
      return WriteTensor(examples[0].target, 1, out);
    }
  }

 private:
  struct State : WorkerState {
    explicit State(const D& d) : dataset(d) {}
    D dataset;
  };
  std::shared_ptr<const D> prototype_;
  Schema schema_;
};

}  // namespace detail

// A DataLoader over a `torch::data` dataset; `dataset()` is the loader's copy of it.
template <typename D>
class DatasetLoader final : public DataLoader {
 public:
  DatasetLoader(std::unique_ptr<Loader> loader, std::shared_ptr<const D> dataset)
      : DataLoader(std::move(loader)), dataset_(std::move(dataset)) {}
  const D& dataset() const noexcept { return *dataset_; }

 private:
  std::shared_ptr<const D> dataset_;
};

namespace detail {

// The order a torch sampler type stands for: shuffled or the data set's own.
template <typename Sampler>
struct SamplerOrder {
  static_assert(sizeof(Sampler) == 0,
                "feedline::torch::make_data_loader: the sampler must be RandomSampler, "
                "SequentialSampler or their Distributed variants (feedline samples itself)");
};
template <>
struct SamplerOrder<::torch::data::samplers::RandomSampler> : std::true_type {};
template <>
struct SamplerOrder<::torch::data::samplers::DistributedRandomSampler> : std::true_type {};
template <>
struct SamplerOrder<::torch::data::samplers::SequentialSampler> : std::false_type {};
template <>
struct SamplerOrder<::torch::data::samplers::DistributedSequentialSampler> : std::false_type {};

// A dataset `.map(Stack<>())`'d is its source: feedline stacks the examples itself.
template <typename D>
struct Unstacked {
  using type = D;
  static D Get(D&& d) { return std::move(d); }
};
template <typename S>
struct Unstacked<::torch::data::datasets::MapDataset<
    S, ::torch::data::transforms::Stack<::torch::data::Example<>>>> {
  using type = S;
  static S Get(::torch::data::datasets::MapDataset<
               S, ::torch::data::transforms::Stack<::torch::data::Example<>>>&& d) {
    return d.dataset();
  }
};

template <typename D>
std::unique_ptr<DatasetLoader<D>> MakeDatasetLoader(D dataset, LoaderOptions options,
                                                    ExampleSpec spec) {
  static_assert(std::is_same_v<typename D::BatchType, std::vector<::torch::data::Example<>>>,
                "feedline::torch::make_data_loader takes datasets of torch::data::Example<> "
                "(data, target), optionally .map(Stack<>())'d, without another batch "
                "transform: feedline stacks");
  static_assert(std::is_copy_constructible_v<D>,
                "each worker gets its own copy of the dataset, as in torch::data");
  const auto size = dataset.size();
  if (!size.has_value()) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "feedline::torch::make_data_loader: the dataset has no size()");
  }
  if (*size == 0) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "feedline::torch::make_data_loader: the dataset is empty");
  }
  auto prototype = std::make_shared<D>(std::move(dataset));
  Schema schema;
  {
    D probe = *prototype;
    std::vector<::torch::data::Example<>> first = GetOne(probe, 0);
    if (first.size() != 1) {
      throw Error(absl::StatusCode::kInvalidArgument,
                  "feedline::torch::make_data_loader: get_batch of one index must give one "
                  "example");
    }
    schema = ExampleSchema(first[0].data, first[0].target, spec);
  }
  auto transform = std::make_shared<ExampleTransform<D>>(prototype, std::move(schema));
  auto records = std::make_shared<EmptyRecords>(int64_t(*size),
                                                Fingerprint(typeid(D).name(), int64_t(*size)));
  std::unique_ptr<Loader> loader =
      CreateLoader(std::move(records), std::move(transform), std::move(options));
  return std::make_unique<DatasetLoader<D>>(std::move(loader), std::move(prototype));
}

}  // namespace detail

// `D`: a stateless `torch::data` dataset of `Example<>`s (a `Dataset<Self>` or a `.map(...)` of
// one, `Stack<>` included), copyable. `Sampler`: the order, as in torch (see the file comment).
// Throws feedline::Error: an unsized dataset, an empty one, get(0) failing, an unsupported
// tensor type, options that do not fit (as Loader::Create).
template <typename Sampler = ::torch::data::samplers::RandomSampler, typename D,
          typename = typename D::BatchRequestType>
std::unique_ptr<DatasetLoader<typename detail::Unstacked<D>::type>> make_data_loader(
    D dataset, LoaderOptions options = {}, ExampleSpec spec = {}) {
  if (!detail::SamplerOrder<Sampler>::value) options.shuffle(false);
  return detail::MakeDatasetLoader(detail::Unstacked<D>::Get(std::move(dataset)),
                                   std::move(options), std::move(spec));
}

template <typename Sampler = ::torch::data::samplers::RandomSampler, typename D,
          typename = typename D::BatchRequestType>
std::unique_ptr<DatasetLoader<typename detail::Unstacked<D>::type>> make_data_loader(
    D dataset, const ::torch::data::DataLoaderOptions& options, ExampleSpec spec = {}) {
  LoaderOptions o = FromTorchOptions(options);
  o.shuffle(detail::SamplerOrder<Sampler>::value);
  return detail::MakeDatasetLoader(detail::Unstacked<D>::Get(std::move(dataset)), std::move(o),
                                   std::move(spec));
}

// torch's `make_data_loader<Sampler>(dataset, batch_size)`.
template <typename Sampler = ::torch::data::samplers::RandomSampler, typename D,
          typename = typename D::BatchRequestType>
std::unique_ptr<DatasetLoader<typename detail::Unstacked<D>::type>> make_data_loader(
    D dataset, size_t batch_size, ExampleSpec spec = {}) {
  return make_data_loader<Sampler>(std::move(dataset),
                                   ::torch::data::DataLoaderOptions(batch_size), std::move(spec));
}

}  // namespace feedline::torch

#endif  // FEEDLINE_TORCH_DATA_H_
