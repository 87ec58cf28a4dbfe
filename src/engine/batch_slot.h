// Batch slots, their layout from the schema, and the pool that recycles them (the prefetch
// ring's memory).
//
// A slot is one arena (HostAllocator: pinned memory on a CUDA machine) holding one column per
// field of the schema, each sized for batch_size samples at the field's largest shape, 64-byte
// aligned, in schema order. Workers write each sample straight into its place: a fixed field at
// `pos * max_bytes` in its final layout; a variable field densely (in the sample's own shape) at
// the same place, its shape beside it. When the batch's last sample is done, AssembleBatch packs
// the variable fields in place: padded to the batch's longest (pad_value), or ragged (back to
// back with offsets). No collation copy for fixed fields, and no allocation per batch.
//
// Slots are recycled: when the last `Batch` that references a slot dies, the slot goes back to
// the pool's free list. The slots the ring owns (in flight + cached) stay within `keep`: a
// returning slot beyond that is freed. Slots the user holds are the user's memory. A pool that is
// gone (loader destroyed) simply frees returning slots, so batches may outlive their loader.
//
// Thread safety: `SlotPool` is safe from any thread (a mutex guards the free list; it is taken
// once per batch, not per sample). A slot is written by workers (disjoint samples), assembled by
// the worker that completes it, and read-only after it is handed out.
#ifndef FEEDLINE_SRC_ENGINE_BATCH_SLOT_H_
#define FEEDLINE_SRC_ENGINE_BATCH_SLOT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "core/host_allocator.h"
#include "feedline/schema.h"
#include "feedline/transform.h"

namespace feedline {
namespace internal {

// Where each field lives in a slot; computed once per loader from the schema.
struct FieldLayout {
  size_t offset = 0;         // of the column in the arena
  int64_t sample_bytes = 0;  // the largest sample's bytes (the column's stride while filling)
  int element_size = 1;
  bool variable = false;
  bool first_dim_only = false;  // the only variable dimension is the first one
};

struct SlotLayout {
  Schema schema;
  int64_t batch_size = 0;
  std::vector<FieldLayout> fields;
  size_t arena_bytes = 0;
  Fill fill = Fill::kDense;  // kSparse when a field is variable (HostAllocator: pages)

  static SlotLayout Make(Schema schema, int64_t batch_size);
  // Bytes one slot costs (arena + per-sample metadata), for the memory budget.
  size_t slot_bytes() const;
  SampleWriter Writer(BatchSlot* slot, int64_t pos) const { return SampleWriter(this, slot, pos); }
  // kInvalidArgument naming the first field of the schema that `w` did not write.
  static absl::Status CheckWritten(const SampleWriter& w);
};

// One field of an assembled batch.
struct Column {
  std::vector<int64_t> shape;          // padded/fixed: [n, ...]; ragged: [total elements]
  std::vector<int64_t> sample_shapes;  // [batch_size * rank]: each sample's own shape
  std::vector<int64_t> lengths;        // variable: each sample's first variable dimension
  std::vector<int64_t> offsets;        // ragged: [n + 1] element offsets
};

struct BatchSlot {
  BatchSlot(HostAllocator* allocator, std::shared_ptr<const SlotLayout> layout);
  ~BatchSlot();
  BatchSlot(const BatchSlot&) = delete;
  BatchSlot& operator=(const BatchSlot&) = delete;

  uint8_t* field_data(int f) const { return arena + layout->fields[size_t(f)].offset; }
  int64_t* sample_shape(int f, int64_t pos) {
    return columns[size_t(f)].sample_shapes.data() + pos * layout->schema.field(f).rank();
  }

  HostAllocator* allocator;
  const std::shared_ptr<const SlotLayout> layout_ref;  // a batch may outlive its loader
  const SlotLayout* layout;
  uint8_t* arena;
  std::vector<Column> columns;
  std::vector<int64_t> indices;  // the data set index of each sample
  int64_t size = 0;              // samples in the batch
  bool in_ring = false;          // between Acquire() and MarkHandedOut(): owned by the loader
};

// Packs the variable fields of a filled slot's first `n` samples in place (see the file comment)
// and sets every column's shape. `scratch` is reused.
void AssembleBatch(BatchSlot* slot, int64_t n, std::vector<uint8_t>* scratch);

// Zeroes sample `pos` in every field (a failed sample) and gives its variable dimensions size 0.
void ClearSample(BatchSlot* slot, int64_t pos);

}  // namespace internal

class SlotPool : public std::enable_shared_from_this<SlotPool> {
 public:
  SlotPool(HostAllocator* allocator, std::shared_ptr<const internal::SlotLayout> layout)
      : allocator_(allocator), layout_(std::move(layout)) {}
  ~SlotPool();

  // A free slot, or a new one. The returned pointer's deleter gives the slot back. Throws
  // std::bad_alloc when a new slot cannot be allocated.
  std::shared_ptr<internal::BatchSlot> Acquire();
  // The slot leaves the ring for the consumer: its memory is the user's until released.
  void MarkHandedOut(internal::BatchSlot* slot);
  // How many slots the ring may own (in flight + cached free ones): the ring depth.
  void set_keep(int n);
  // Called by Acquire when no slot is free, before allocating one: a holder of slots that are
  // no longer needed (the copy stage) gives them back; with `wait_ns` > 0 (every slot the ring
  // may own exists: the missing ones are being copied from) it waits up to that long for one.
  // Set before the pool is used.
  void set_reclaim(std::function<void(int64_t wait_ns)> reclaim) { reclaim_ = std::move(reclaim); }
  // How long Acquire waits for a slot being copied from before it allocates one more: a batch's
  // copy takes about a millisecond; a stalled device (a consumer that holds it) gets a new slot.
  static constexpr int64_t kReclaimWaitNs = 20'000'000;
  // Allocates free slots up to `keep` now (pinned memory: when the loader is made, not in the
  // middle of training, where cudaHostAlloc synchronises). Throws std::bad_alloc as Acquire.
  void Reserve();

  size_t slot_bytes() const { return layout_->slot_bytes(); }
  int64_t allocated() const { return allocated_.load(std::memory_order_relaxed); }
  int64_t created() const { return created_.load(std::memory_order_relaxed); }
  int64_t cached() const;
  int64_t in_ring() const { return in_ring_.load(std::memory_order_relaxed); }

 private:
  void Return(internal::BatchSlot* slot);
  // A new slot, counted (throws std::bad_alloc).
  internal::BatchSlot* NewSlot();

  HostAllocator* const allocator_;
  const std::shared_ptr<const internal::SlotLayout> layout_;
  std::function<void(int64_t wait_ns)> reclaim_;
  std::atomic<int64_t> allocated_{0};  // alive now
  std::atomic<int64_t> created_{0};    // ever
  std::atomic<int64_t> in_ring_{0};
  mutable std::mutex mu_;
  std::vector<internal::BatchSlot*> free_ ABSL_GUARDED_BY(mu_);
  int keep_ ABSL_GUARDED_BY(mu_) = 4;
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_ENGINE_BATCH_SLOT_H_
