// feedline — LibTorch adapter: batches as tensors, the way `torch::data` hands them out.
//
//   #include <feedline/torch.h>
//   auto loader = feedline::torch::make_data_loader(
//       "data/train", feedline::LoaderOptions().batch_size(256).workers(4));
//   for (auto& batch : *loader) {   // one epoch; every loop over *loader starts the next one
//     Train(batch.data,             // uint8 [B, 3, H, W] (NCHW; [B, H, W, 3] for NHWC), CPU
//           batch.target);          // int64 [B]; batch.index: int64 [B] data set sample indices
//   }
//
// Zero-copy: the three tensors of a batch are views of its slot in the prefetch ring. The slot
// returns to the ring when the last of them is destroyed, whichever thread that happens on, and
// the loader may be destroyed first. Holding tensors never stalls the loader (it allocates a
// replacement slot), but held slots are the user's memory: keep them no longer than a training
// step needs, or `clone()` what must live longer. The tensors are writable: their memory belongs
// to the holder until released (`data` may be normalized in place, for example).
//
// Errors throw `feedline::Error` (see error.h): creation errors (`code()` kNotFound,
// kInvalidArgument, ...), and a sample that failed under `OnError::kRaise` at the batch it
// belongs to, naming the file and the cause. After such a throw the epoch goes on: incrementing
// the iterator again yields the next batch (a range-for loop is left by the exception).
//
// The tensors are CPU tensors unless the loader's device is a GPU (`LoaderOptions::device`);
// then data and target are CUDA tensors that the stream they will be used on waits for: pass
// it (`c10::cuda::getCurrentCUDAStream().stream()` with a CUDA LibTorch) to
// `DataLoader::set_cuda_stream` or `to_torch`; by default the legacy default stream (the
// adapter does not link c10_cuda, so it cannot ask for the current stream itself).
//
// This header includes <torch/data/example.h> (a `Batch` is a `torch::data::Example<>`, so
// torch's `for (torch::data::Example<>& batch : *loader)` compiles unchanged): `at::Tensor` *is*
// `torch::Tensor`. Note that inside `namespace feedline`, `torch::` names this namespace: write
// `::torch::` there.
//
// Thread safety: as `feedline::Loader`: one thread iterates a `DataLoader` at a time; `stats()`
// may be called from any thread. Batches and their tensors may be used and destroyed anywhere.
#ifndef FEEDLINE_TORCH_H_
#define FEEDLINE_TORCH_H_

#include <ATen/core/Tensor.h>
#include <torch/data/example.h>

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <string>

#include "feedline/batch.h"
#include "feedline/error.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/stats.h"

namespace feedline::torch {

// One batch as tensors: a `torch::data::Example<>` (`data`, `target`) with more.
// Images: data = the "image" field, uint8 [B, 3, H, W] (Layout::kNCHW) or [B, H, W, 3] (kNHWC);
// target = "label", int64 [B], the class labels. A `torch::data` dataset (torch_data.h): its
// examples' data and target, stacked. Any other schema: the fields "data" and "target" (else the
// first two fields).
struct Batch : ::torch::data::Example<> {
  at::Tensor index;           // int64 [B]: each sample's index in the data set (loader.dataset())
  at::Tensor lengths;         // int64 [B] when `data` has a variable dimension (padded); else empty
  at::Tensor target_lengths;  // the same for `target`
  int64_t epoch = 0;          // the epoch the batch belongs to
  int64_t position = 0;       // the batch's position in its epoch, 0-based
};

// Zero-copy tensor views of `batch` (which must come from a loader: non-empty). The views keep
// the batch's slot alive; `batch` itself may be dropped.
// A GPU batch: `cuda_stream` (a cudaStream_t; null = the legacy default stream) waits for it,
// and its device buffer is reused only after the work queued there at release.
Batch to_torch(const ::feedline::Batch& batch, void* cuda_stream = nullptr);
// One field of `batch` as a zero-copy tensor ([B, ...]; ragged fields: their values, [total]).
at::Tensor to_tensor(const ::feedline::Batch& batch, int field, void* cuda_stream = nullptr);

// A `feedline::Loader` with a `torch::data`-like face: a range-for gives `Batch`es.
class DataLoader {
 public:
  // An input iterator over one epoch. It shares the epoch with its copies; the epoch ends (the
  // iterator becomes equal to `end()`) after the last batch, or when a newer epoch of the same
  // loader starts (starting an epoch cancels the previous one) or the loader is destroyed.
  class Iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = Batch*;
    using reference = Batch&;

    Iterator() = default;  // the end iterator
    Batch& operator*() { return current_; }
    Batch* operator->() { return &current_; }
    // The next batch; throws `feedline::Error` if it failed (the iterator stays usable).
    Iterator& operator++();
    friend bool operator==(const Iterator& a, const Iterator& b) { return a.done_ == b.done_; }
    friend bool operator!=(const Iterator& a, const Iterator& b) { return !(a == b); }

   private:
    friend class DataLoader;
    Iterator(std::shared_ptr<Epoch> epoch, void* cuda_stream);
    std::shared_ptr<Epoch> epoch_;
    void* cuda_stream_ = nullptr;
    Batch current_;
    bool done_ = true;
  };

  // `loader` must not be null.
  explicit DataLoader(std::unique_ptr<Loader> loader);
  virtual ~DataLoader() = default;

  // Starts the next epoch (the one `set_epoch` chose, else the one after the last) and fetches
  // its first batch: throws `feedline::Error` if that batch failed.
  Iterator begin();
  Iterator end() { return Iterator(); }

  // GPU loaders: the stream the batches will be used on (a cudaStream_t; null, the default:
  // the legacy default stream). Applies to the batches fetched after the call.
  void set_cuda_stream(void* cuda_stream) noexcept { cuda_stream_ = cuda_stream; }

  size_t size() const noexcept;  // batches per epoch (for this rank): len(loader)
  void set_epoch(int64_t epoch);
  int64_t next_epoch() const noexcept;
  Stats stats() const;
  const LoaderOptions& options() const noexcept;  // "auto" fields resolved
  Loader& loader() noexcept { return *loader_; }
  const Loader& loader() const noexcept { return *loader_; }

 private:
  std::unique_ptr<Loader> loader_;
  void* cuda_stream_ = nullptr;
};

// Scans `source` (ImageFolder directory or list file; it replaces `options.source()`) and
// makes a loader. Throws `feedline::Error` (kNotFound, kInvalidArgument, kResourceExhausted).
// For `torch::data` datasets, see feedline/torch_data.h.
std::unique_ptr<DataLoader> make_data_loader(std::string source, LoaderOptions options = {});

}  // namespace feedline::torch

#endif  // FEEDLINE_TORCH_H_
