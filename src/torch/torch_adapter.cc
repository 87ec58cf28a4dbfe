// The LibTorch adapter (see include/feedline/torch.h). The only translation unit of the library
// that includes the full torch headers.
#include <torch/types.h>

#include <array>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "feedline/torch.h"
#include "feedline/torch_data.h"

namespace feedline::torch {
namespace {

// A view of `bytes` of the slot with the given shape and type. Every view owns a reference to
// one heap copy of the batch (shared by the batch's views): its deleter drops the reference, and
// the slot goes back to the ring when the last view is gone.
at::Tensor View(const std::shared_ptr<const ::feedline::Batch>& holder, const void* bytes,
                at::IntArrayRef sizes, at::ScalarType type, int device) {
  // from_blob wants a mutable pointer; the slot's memory is the holder's until released (see
  // batch.h), so writing through the tensor is allowed.
  auto options = ::torch::TensorOptions().dtype(type);
  options = device >= 0 ? options.device(::torch::kCUDA, static_cast<int16_t>(device))
                        : options.device(::torch::kCPU);
  return ::torch::from_blob(
      const_cast<void*>(bytes), sizes, [keep = holder](void*) mutable { keep.reset(); }, options);
}

at::ScalarType ScalarType(::feedline::DType t) {
  switch (t) {
    case ::feedline::DType::kFloat32:
      return at::kFloat;
    case ::feedline::DType::kFloat16:
      return at::kHalf;
    case ::feedline::DType::kBFloat16:
      return at::kBFloat16;
    case ::feedline::DType::kInt32:
      return at::kInt;
    case ::feedline::DType::kInt64:
      return at::kLong;
    case ::feedline::DType::kFloat64:
      return at::kDouble;
    case ::feedline::DType::kBool:
      return at::kBool;
    case ::feedline::DType::kInt8:
      return at::kChar;
    case ::feedline::DType::kInt16:
      return at::kShort;
    case ::feedline::DType::kUint8:
    case ::feedline::DType::kBytes:
      break;
  }
  return at::kByte;
}

// Every field of a batch as a view; `holder` is shared by the views.
at::Tensor FieldView(const std::shared_ptr<const ::feedline::Batch>& holder, int field) {
  const TensorView v = holder->field(field);
  return View(holder, v.data, v.shape, ScalarType(v.dtype), v.device);
}

at::Tensor LengthsView(const std::shared_ptr<const ::feedline::Batch>& holder, int field) {
  const TensorView v = holder->field(field);
  if (v.lengths == nullptr || v.ragged()) return at::Tensor();
  return View(holder, v.lengths, {holder->size()}, at::kLong, -1);
}

}  // namespace

Batch to_torch(const ::feedline::Batch& batch, void* cuda_stream) {
  const Schema& schema = batch.schema();
  if (schema.size() == 0) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "feedline::torch::to_torch: an empty batch (not one from a loader)");
  }
  auto holder = std::make_shared<const ::feedline::Batch>(batch);
  if (batch.device() >= 0) {
    // The consumer's stream waits for the copy (an event: no host wait).
    if (absl::Status s = batch.set_consumer_stream(cuda_stream); !s.ok()) throw Error(s);
  }
  int data = schema.Find("image"), target = schema.Find("label");
  if (data < 0) {
    data = schema.Find("data");
    target = schema.Find("target");
  }
  if (data < 0) data = 0;
  if (target < 0 && schema.size() > 1) target = data == 0 ? 1 : 0;
  Batch out;
  out.data = FieldView(holder, data);
  out.lengths = LengthsView(holder, data);
  if (target >= 0) {
    out.target = FieldView(holder, target);
    out.target_lengths = LengthsView(holder, target);
  }
  out.index = View(holder, batch.indices(), {batch.size()}, at::kLong, -1);
  out.epoch = batch.epoch();
  out.position = batch.index();
  return out;
}

at::Tensor to_tensor(const ::feedline::Batch& batch, int field, void* cuda_stream) {
  if (field < 0 || field >= batch.num_fields()) {
    throw Error(absl::StatusCode::kInvalidArgument,
                absl::StrCat("feedline::torch::to_tensor: no field #", field));
  }
  if (batch.device() >= 0) {
    if (absl::Status s = batch.set_consumer_stream(cuda_stream); !s.ok()) throw Error(s);
  }
  return FieldView(std::make_shared<const ::feedline::Batch>(batch), field);
}

// ---------------------------------------------------------------------------------------------
// torch::data datasets (torch_data.h)

LoaderOptions FromTorchOptions(const ::torch::data::DataLoaderOptions& o) {
  LoaderOptions out;
  out.batch_size(int64_t(o.batch_size()));
  out.workers(o.workers() == 0 ? kAuto : int(o.workers()));
  out.drop_last(o.drop_last());
  return out;
}

namespace detail {
namespace {

absl::StatusOr<DType> FromScalarType(at::ScalarType t) {
  switch (t) {
    case at::kByte:
      return DType::kUint8;
    case at::kFloat:
      return DType::kFloat32;
    case at::kHalf:
      return DType::kFloat16;
    case at::kBFloat16:
      return DType::kBFloat16;
    case at::kInt:
      return DType::kInt32;
    case at::kLong:
      return DType::kInt64;
    case at::kDouble:
      return DType::kFloat64;
    case at::kBool:
      return DType::kBool;
    case at::kChar:
      return DType::kInt8;
    case at::kShort:
      return DType::kInt16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("tensors of type ", c10::toString(t),
                       " have no feedline dtype (bool, uint8, int8, int16, int32, int64, "
                       "float16, bfloat16, float32, float64): convert them in get(), e.g. .to(torch::kFloat)"));
  }
}

Field MakeField(const std::string& name, const at::Tensor& t, const std::vector<Dim>& declared,
                double pad) {
  if (!t.defined()) {
    throw Error(absl::StatusCode::kInvalidArgument,
                absl::StrCat("feedline::torch::make_data_loader: get(0).", name, " is undefined"));
  }
  absl::StatusOr<DType> dtype = FromScalarType(t.scalar_type());
  if (!dtype.ok()) {
    throw Error(dtype.status().code(), absl::StrCat("feedline::torch::make_data_loader: ", name,
                                                    ": ", dtype.status().message()));
  }
  std::vector<Dim> shape;
  if (declared.empty()) {
    for (int64_t d : t.sizes()) shape.push_back(Dim(d));
  } else {
    shape = declared;
  }
  return Field(name, *dtype, std::move(shape)).pad_value(pad);
}

}  // namespace

Schema ExampleSchema(const at::Tensor& data, const at::Tensor& target, const ExampleSpec& spec) {
  Schema schema({MakeField("data", data, spec.data_shape, spec.data_pad_value),
                 MakeField("target", target, spec.target_shape, spec.target_pad_value)});
  if (absl::Status s = schema.Validate(); !s.ok()) throw Error(s);
  return schema;
}

absl::Status WriteTensor(const at::Tensor& t, int field, SampleWriter& out) {
  const Field& f = out.schema().field(field);
  if (!t.defined()) return absl::InvalidArgumentError(absl::StrCat(f.name(), ": undefined"));
  if (!t.device().is_cpu()) {
    return absl::InvalidArgumentError(
        absl::StrCat(f.name(), ": a ", t.device().str(), " tensor; get() must return CPU tensors"));
  }
  absl::StatusOr<DType> dtype = FromScalarType(t.scalar_type());
  if (!dtype.ok() || *dtype != f.dtype()) {
    return absl::InvalidArgumentError(
        absl::StrCat("field '", f.name(), "': a ", c10::toString(t.scalar_type()),
                     " tensor where the field is ", DTypeName(f.dtype())));
  }
  if (t.is_contiguous()) {
    return out.Write(field, absl::MakeConstSpan(t.sizes().data(), t.sizes().size()), t.data_ptr());
  }
  const at::Tensor dense = t.contiguous();
  return out.Write(field, absl::MakeConstSpan(dense.sizes().data(), dense.sizes().size()),
                   dense.data_ptr());
}

std::unique_ptr<Loader> CreateLoader(std::shared_ptr<const Dataset> dataset,
                                     std::shared_ptr<const SampleTransform> transform,
                                     LoaderOptions options) {
  absl::StatusOr<std::unique_ptr<Loader>> loader =
      Loader::Create(std::move(dataset), std::move(transform), std::move(options));
  if (!loader.ok()) throw Error(loader.status());
  return *std::move(loader);
}

uint64_t Fingerprint(const char* type_name, int64_t size) {
  uint64_t h = 1469598103934665603ULL;  // FNV-1a over the type's name and the size
  for (const char* p = type_name; *p != 0; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ULL;
  for (int i = 0; i < 8; ++i) h = (h ^ uint8_t(uint64_t(size) >> (8 * i))) * 1099511628211ULL;
  return h;
}

}  // namespace detail

// ---------------------------------------------------------------------------------------------
// DataLoader

DataLoader::Iterator::Iterator(std::shared_ptr<Epoch> epoch, void* cuda_stream)
    : epoch_(std::move(epoch)), cuda_stream_(cuda_stream), done_(false) {
  ++*this;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (done_) return *this;
  current_ = Batch();  // drop the previous batch's views before waiting for the next one
  absl::StatusOr<::feedline::Batch> next = epoch_->Next();
  if (next.ok()) {
    current_ = to_torch(*next, cuda_stream_);
    return *this;
  }
  // kOutOfRange: the epoch is over. kCancelled: a newer epoch started or the loader is gone;
  // the epoch is over too, as for feedline::Loader's own iterator.
  if (absl::IsOutOfRange(next.status()) || absl::IsCancelled(next.status())) {
    done_ = true;
    epoch_.reset();
    return *this;
  }
  throw Error(next.status());  // a failed sample: "<file>: <cause>"; the epoch goes on
}

DataLoader::DataLoader(std::unique_ptr<Loader> loader) : loader_(std::move(loader)) {
  if (loader_ == nullptr) {
    throw Error(absl::StatusCode::kInvalidArgument, "feedline::torch::DataLoader: null loader");
  }
}

DataLoader::Iterator DataLoader::begin() {
  return Iterator(std::shared_ptr<Epoch>(loader_->StartEpoch()), cuda_stream_);
}

size_t DataLoader::size() const noexcept { return static_cast<size_t>(loader_->num_batches()); }
void DataLoader::set_epoch(int64_t epoch) { loader_->set_epoch(epoch); }
int64_t DataLoader::next_epoch() const noexcept { return loader_->next_epoch(); }
Stats DataLoader::stats() const { return loader_->stats(); }
const LoaderOptions& DataLoader::options() const noexcept { return loader_->options(); }

std::unique_ptr<DataLoader> make_data_loader(std::string source, LoaderOptions options) {
  absl::StatusOr<std::unique_ptr<Loader>> loader =
      Loader::Create(std::move(options).source(std::move(source)));
  if (!loader.ok()) throw Error(loader.status());
  return std::make_unique<DataLoader>(*std::move(loader));
}

}  // namespace feedline::torch
