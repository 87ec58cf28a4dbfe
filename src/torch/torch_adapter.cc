// The LibTorch adapter (see include/feedline/torch.h). The only translation unit of the library
// that includes the full torch headers.
#include <torch/types.h>

#include <array>
#include <utility>

#include "absl/status/status.h"
#include "feedline/torch.h"

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

at::ScalarType ImageType(::feedline::DType t) {
  switch (t) {
    case ::feedline::DType::kFloat32:
      return at::kFloat;
    case ::feedline::DType::kFloat16:
      return at::kHalf;
    case ::feedline::DType::kBFloat16:
      return at::kBFloat16;
    case ::feedline::DType::kUint8:
      break;
  }
  return at::kByte;
}

}  // namespace

Batch to_torch(const ::feedline::Batch& batch) {
  if (batch.images() == nullptr) {
    throw Error(absl::StatusCode::kInvalidArgument,
                "feedline::torch::to_torch: an empty batch (not one from a loader)");
  }
  auto holder = std::make_shared<const ::feedline::Batch>(batch);
  const std::array<int64_t, 4> shape = batch.image_shape();
  const int64_t n = batch.size();
  Batch out;
  const int device = batch.device();
  if (device >= 0) {
    // A CUDA-enabled LibTorch's default current stream is the legacy default stream: make it
    // wait for the copy (Debian's LibTorch is CPU-only, so no c10::cuda stream API here).
    batch.set_consumer_stream(nullptr);
  }
  out.data = View(holder, batch.images(), shape, ImageType(batch.dtype()), device);
  out.target = View(holder, batch.labels(), {n}, at::kLong, device);
  out.index = View(holder, batch.indices(), {n}, at::kLong, -1);
  out.epoch = batch.epoch();
  out.position = batch.index();
  return out;
}

// ---------------------------------------------------------------------------------------------
// DataLoader

DataLoader::Iterator::Iterator(std::shared_ptr<Epoch> epoch)
    : epoch_(std::move(epoch)), done_(false) {
  ++*this;
}

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  if (done_) return *this;
  current_ = Batch();  // drop the previous batch's views before waiting for the next one
  absl::StatusOr<::feedline::Batch> next = epoch_->Next();
  if (next.ok()) {
    current_ = to_torch(*next);
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
  return Iterator(std::shared_ptr<Epoch>(loader_->StartEpoch()));
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
