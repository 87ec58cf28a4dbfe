#include "engine/batch_slot.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/float16.h"
#include "feedline/batch.h"

namespace feedline {
namespace internal {
namespace {

constexpr size_t kColumnAlign = 64;

size_t AlignUp(size_t n) { return (n + kColumnAlign - 1) / kColumnAlign * kColumnAlign; }

// Writes `count` copies of `v` in `dtype` at `dst`.
void FillValue(uint8_t* dst, int64_t count, DType dtype, double v) {
  if (count <= 0) return;
  if (v == 0) {
    std::memset(dst, 0, size_t(count) * size_t(ElementSize(dtype)));
    return;
  }
  auto fill = [&](auto x) {
    using T = decltype(x);
    T* out = reinterpret_cast<T*>(dst);
    std::fill(out, out + count, x);
  };
  switch (dtype) {
    case DType::kUint8:
    case DType::kBytes:
      std::memset(dst, int(uint8_t(v)), size_t(count));
      return;
    case DType::kBool:
      std::memset(dst, v != 0 ? 1 : 0, size_t(count));
      return;
    case DType::kInt8:
      return fill(int8_t(v));
    case DType::kInt16:
      return fill(int16_t(v));
    case DType::kFloat64:
      return fill(double(v));
    case DType::kInt32:
      return fill(int32_t(v));
    case DType::kInt64:
      return fill(int64_t(v));
    case DType::kFloat32:
      return fill(float(v));
    case DType::kFloat16:
      return fill(FloatToHalf(float(v)));
    case DType::kBFloat16:
      return fill(FloatToBFloat16(float(v)));
  }
}

int64_t Product(const int64_t* dims, int n) {
  int64_t p = 1;
  for (int i = 0; i < n; ++i) p *= dims[i];
  return p;
}

// Copies a dense tensor of shape `from` (rank r) into a dense tensor of shape `to` (every
// dimension >= from's), row by row; the rest of `to` is left as it is.
void ScatterRows(const uint8_t* src, const int64_t* from, uint8_t* dst, const int64_t* to, int r,
                 int es) {
  if (r == 0) {
    std::memcpy(dst, src, size_t(es));
    return;
  }
  const size_t row = size_t(from[r - 1]) * size_t(es);
  const int64_t rows = Product(from, r - 1);
  if (rows == 0 || row == 0) return;
  std::vector<int64_t> idx(size_t(r), 0);  // index over the outer r - 1 dimensions
  for (int64_t k = 0; k < rows; ++k) {
    int64_t off = 0;  // element offset in `to`
    for (int d = 0; d < r - 1; ++d) off = off * to[d] + idx[size_t(d)];
    off *= to[r - 1];
    std::memcpy(dst + size_t(off) * size_t(es), src + size_t(k) * row, row);
    for (int d = r - 2; d >= 0; --d) {
      if (++idx[size_t(d)] < from[d]) break;
      idx[size_t(d)] = 0;
    }
  }
}

}  // namespace

SlotLayout SlotLayout::Make(Schema schema, int64_t batch_size) {
  SlotLayout l;
  l.batch_size = batch_size;
  size_t at = 0;
  for (const Field& f : schema.fields()) {
    FieldLayout fl;
    fl.offset = at;
    fl.sample_bytes = f.max_bytes();
    fl.element_size = ElementSize(f.dtype());
    fl.variable = f.variable();
    fl.first_dim_only = fl.variable && f.shape()[0].variable;
    for (size_t d = 1; d < f.shape().size(); ++d) {
      if (f.shape()[d].variable) fl.first_dim_only = false;
    }
    if (fl.variable) l.fill = Fill::kSparse;  // samples at strides of their largest size
    l.fields.push_back(fl);
    at = AlignUp(at + size_t(fl.sample_bytes) * size_t(batch_size));
  }
  l.arena_bytes = std::max<size_t>(at, kColumnAlign);
  l.schema = std::move(schema);
  return l;
}

absl::Status SlotLayout::CheckWritten(const SampleWriter& w) {
  const SlotLayout& l = *w.layout_;
  for (int f = 0; f < l.schema.size(); ++f) {
    if ((w.written_ & (uint64_t{1} << f)) == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("the transform did not write field '", l.schema.field(f).name(), "'"));
    }
  }
  return absl::OkStatus();
}

size_t SlotLayout::slot_bytes() const {
  size_t meta = sizeof(int64_t);  // indices
  for (const Field& f : schema.fields()) {
    meta += sizeof(int64_t) * (size_t(f.rank()) + (f.variable() ? 2 : 0));
  }
  return arena_bytes + meta * size_t(batch_size);
}

BatchSlot::BatchSlot(HostAllocator* a, std::shared_ptr<const SlotLayout> ref)
    : allocator(a),
      layout_ref(std::move(ref)),
      layout(layout_ref.get()),
      arena(static_cast<uint8_t*>(a->Allocate(layout->arena_bytes, layout->fill))),
      columns(size_t(layout->schema.size())),
      indices(size_t(layout->batch_size)) {
  const SlotLayout* l = layout;
  for (int f = 0; f < l->schema.size(); ++f) {
    const Field& field = l->schema.field(f);
    Column& c = columns[size_t(f)];
    c.sample_shapes.resize(size_t(l->batch_size) * size_t(field.rank()));
    for (int64_t i = 0; i < l->batch_size; ++i) {
      for (int d = 0; d < field.rank(); ++d) {
        c.sample_shapes[size_t(i * field.rank() + d)] = field.shape()[size_t(d)].size;
      }
    }
    if (field.variable()) {
      c.lengths.resize(size_t(l->batch_size));
      if (field.collate() == Collate::kRagged) c.offsets.resize(size_t(l->batch_size) + 1);
    }
  }
}

BatchSlot::~BatchSlot() { allocator->Free(arena, layout->arena_bytes); }

void ClearSample(BatchSlot* slot, int64_t pos) {
  const SlotLayout& l = *slot->layout;
  for (int f = 0; f < l.schema.size(); ++f) {
    const Field& field = l.schema.field(f);
    const FieldLayout& fl = l.fields[size_t(f)];
    int64_t* shape = slot->sample_shape(f, pos);
    for (int d = 0; d < field.rank(); ++d) {
      shape[d] = field.shape()[size_t(d)].variable ? 0 : field.shape()[size_t(d)].size;
    }
    if (!fl.variable) {
      std::memset(slot->field_data(f) + size_t(pos) * size_t(fl.sample_bytes), 0,
                  size_t(fl.sample_bytes));
    }
  }
}

void AssembleBatch(BatchSlot* slot, int64_t n, std::vector<uint8_t>* scratch) {
  const SlotLayout& l = *slot->layout;
  slot->size = n;
  for (int f = 0; f < l.schema.size(); ++f) {
    const Field& field = l.schema.field(f);
    const FieldLayout& fl = l.fields[size_t(f)];
    Column& c = slot->columns[size_t(f)];
    const int r = field.rank();
    c.shape.assign(1, n);
    if (!fl.variable) {
      for (const Dim& d : field.shape()) c.shape.push_back(d.size);
      continue;
    }
    int first_var = 0;
    while (!field.shape()[size_t(first_var)].variable) ++first_var;
    for (int64_t i = 0; i < n; ++i) {
      c.lengths[size_t(i)] = c.sample_shapes[size_t(i * r + first_var)];
    }
    uint8_t* base = slot->field_data(f);
    const int es = fl.element_size;
    if (field.collate() == Collate::kRagged) {
      // Back to back: sample i moves down to offsets[i] (never above where it is now).
      int64_t at = 0;
      for (int64_t i = 0; i < n; ++i) {
        c.offsets[size_t(i)] = at;
        const int64_t elems = Product(&c.sample_shapes[size_t(i * r)], r);
        uint8_t* src = base + size_t(i) * size_t(fl.sample_bytes);
        uint8_t* dst = base + size_t(at) * size_t(es);
        if (dst != src) std::memmove(dst, src, size_t(elems) * size_t(es));
        at += elems;
      }
      c.offsets[size_t(n)] = at;
      c.shape.assign(1, at);
      continue;
    }
    // Padded: the batch's longest per dimension.
    std::vector<int64_t> longest(size_t(r), 0);
    for (int d = 0; d < r; ++d) {
      if (!field.shape()[size_t(d)].variable) longest[size_t(d)] = field.shape()[size_t(d)].size;
    }
    for (int64_t i = 0; i < n; ++i) {
      for (int d = 0; d < r; ++d) {
        longest[size_t(d)] = std::max(longest[size_t(d)], c.sample_shapes[size_t(i * r + d)]);
      }
    }
    const int64_t padded_elems = Product(longest.data(), r);
    const size_t padded_bytes = size_t(padded_elems) * size_t(es);
    assert(padded_bytes <= size_t(fl.sample_bytes) && "a sample beyond its field's maximum");
    // Sample i goes to [i * padded, (i + 1) * padded), which ends at or before where sample
    // i + 1 is now: processing in order never overwrites a sample not yet moved.
    for (int64_t i = 0; i < n; ++i) {
      const int64_t* own = &c.sample_shapes[size_t(i * r)];
      const int64_t elems = Product(own, r);
      uint8_t* src = base + size_t(i) * size_t(fl.sample_bytes);
      uint8_t* dst = base + size_t(i) * padded_bytes;
      if (fl.first_dim_only) {
        // Rows are contiguous in both shapes: move, then pad the tail.
        if (dst != src) std::memmove(dst, src, size_t(elems) * size_t(es));
        FillValue(dst + size_t(elems) * size_t(es), padded_elems - elems, field.dtype(),
                  field.pad_value());
      } else {
        scratch->assign(src, src + size_t(elems) * size_t(es));
        FillValue(dst, padded_elems, field.dtype(), field.pad_value());
        ScatterRows(scratch->data(), own, dst, longest.data(), r, es);
      }
    }
    c.shape.insert(c.shape.end(), longest.begin(), longest.end());
  }
}

}  // namespace internal

// ---------------------------------------------------------------------------------------------
// SampleWriter (declared in the public transform.h; its memory is the slot's)

void* SampleWriter::Fixed(int field) {
  const internal::FieldLayout& fl = layout_->fields[size_t(field)];
  assert(!fl.variable && "SampleWriter::Fixed on a field with variable dimensions: use Shaped");
  written_ |= uint64_t{1} << field;
  return slot_->field_data(field) + size_t(pos_) * size_t(fl.sample_bytes);
}

absl::StatusOr<void*> SampleWriter::Shaped(int field, absl::Span<const int64_t> shape) {
  if (field < 0 || field >= layout_->schema.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("no field #", field, " in the schema (", layout_->schema.size(), " fields)"));
  }
  const Field& f = layout_->schema.field(field);
  bool fits = int(shape.size()) == f.rank();
  for (int d = 0; fits && d < f.rank(); ++d) {
    const Dim& dim = f.shape()[size_t(d)];
    fits = dim.variable ? shape[size_t(d)] >= 0 && shape[size_t(d)] <= dim.size
                        : shape[size_t(d)] == dim.size;
  }
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat("field '", f.name(), "': a sample of shape [",
                                                   absl::StrJoin(shape, ", "), "] does not fit ",
                                                   f.DebugString()));
  }
  std::copy(shape.begin(), shape.end(), slot_->sample_shape(field, pos_));
  written_ |= uint64_t{1} << field;
  const internal::FieldLayout& fl = layout_->fields[size_t(field)];
  return static_cast<void*>(slot_->field_data(field) + size_t(pos_) * size_t(fl.sample_bytes));
}

absl::Status SampleWriter::Write(int field, absl::Span<const int64_t> shape, const void* data) {
  absl::StatusOr<void*> dst = Shaped(field, shape);
  if (!dst.ok()) return dst.status();
  int64_t elems = 1;
  for (int64_t d : shape) elems *= d;
  std::memcpy(*dst, data, size_t(elems) * size_t(ElementSize(schema().field(field).dtype())));
  return absl::OkStatus();
}

const Schema& SampleWriter::schema() const noexcept { return layout_->schema; }

// ---------------------------------------------------------------------------------------------
// SlotPool

SlotPool::~SlotPool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (internal::BatchSlot* s : free_) delete s;
}

std::shared_ptr<internal::BatchSlot> SlotPool::Acquire() {
  // The free list; then the slots whose copies are done; then, when every slot the ring may own
  // exists already (the one missing here is still being copied from: a new epoch's first
  // batches while the last epoch's last copies run), a short wait for one rather than pinned
  // memory allocated in the middle of training (test_copy_stage's pinned-slot test saw that in
  // 2 to 4 of 60 runs).
  internal::BatchSlot* slot = nullptr;
  for (int attempt = 0; attempt < 3 && slot == nullptr; ++attempt) {
    if (attempt > 0) {
      if (!reclaim_) break;
      if (attempt == 2) {
        std::lock_guard<std::mutex> lock(mu_);
        if (allocated_.load(std::memory_order_relaxed) < keep_) break;
      }
      reclaim_(attempt == 2 ? kReclaimWaitNs : 0);
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    }
  }
  if (slot == nullptr) slot = NewSlot();
  slot->in_ring = true;
  in_ring_.fetch_add(1, std::memory_order_relaxed);
  std::weak_ptr<SlotPool> weak = weak_from_this();
  return std::shared_ptr<internal::BatchSlot>(slot, [weak](internal::BatchSlot* s) {
    if (std::shared_ptr<SlotPool> pool = weak.lock()) {
      pool->Return(s);
    } else {
      delete s;
    }
  });
}

internal::BatchSlot* SlotPool::NewSlot() {
  auto* slot = new internal::BatchSlot(allocator_, layout_);
  allocated_.fetch_add(1, std::memory_order_relaxed);
  created_.fetch_add(1, std::memory_order_relaxed);
  return slot;
}

void SlotPool::MarkHandedOut(internal::BatchSlot* slot) {
  if (slot->in_ring) {
    slot->in_ring = false;
    in_ring_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void SlotPool::Return(internal::BatchSlot* slot) {
  MarkHandedOut(slot);  // a slot opened but never handed out (cancelled epoch)
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (int64_t(free_.size()) + in_ring_.load(std::memory_order_relaxed) < keep_) {
      free_.push_back(slot);
      return;
    }
  }
  delete slot;
  allocated_.fetch_sub(1, std::memory_order_relaxed);
}

void SlotPool::set_keep(int n) {
  std::vector<internal::BatchSlot*> drop;
  {
    std::lock_guard<std::mutex> lock(mu_);
    keep_ = n;
    while (static_cast<int>(free_.size()) > keep_) {
      drop.push_back(free_.back());
      free_.pop_back();
    }
  }
  for (internal::BatchSlot* s : drop) {
    delete s;
    allocated_.fetch_sub(1, std::memory_order_relaxed);
  }
}

void SlotPool::Reserve() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (int64_t(free_.size()) + in_ring_.load(std::memory_order_relaxed) >= keep_) return;
    }
    internal::BatchSlot* slot = NewSlot();
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(slot);
  }
}

int64_t SlotPool::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

// ---------------------------------------------------------------------------------------------
// BatchBuilder (batch.h): a SlotPool of its own, the loader's assembly.

struct BatchBuilder::Impl {
  std::shared_ptr<const internal::SlotLayout> layout;
  std::shared_ptr<SlotPool> pool;
  std::shared_ptr<internal::BatchSlot> slot;  // the batch being built
  std::vector<SampleWriter> writers;
  std::vector<char> started;
  std::vector<uint8_t> scratch;

  void Take() {
    if (slot != nullptr) return;
    slot = pool->Acquire();
    std::fill(started.begin(), started.end(), 0);
  }
};

absl::StatusOr<std::unique_ptr<BatchBuilder>> BatchBuilder::Create(Schema schema,
                                                                   int64_t batch_size) {
  if (absl::Status s = schema.Validate(); !s.ok()) return s;
  if (batch_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("batch_size: must be >= 1, got ", batch_size));
  }
  auto impl = std::make_unique<Impl>();
  impl->layout = std::make_shared<const internal::SlotLayout>(
      internal::SlotLayout::Make(std::move(schema), batch_size));
  impl->pool = std::make_shared<SlotPool>(DefaultHostAllocator(), impl->layout);
  impl->pool->set_keep(2);
  impl->started.assign(size_t(batch_size), 0);
  for (int64_t i = 0; i < batch_size; ++i) {
    impl->writers.push_back(impl->layout->Writer(nullptr, i));
  }
  return std::unique_ptr<BatchBuilder>(new BatchBuilder(std::move(impl)));
}

BatchBuilder::BatchBuilder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BatchBuilder::~BatchBuilder() = default;

const Schema& BatchBuilder::schema() const noexcept { return impl_->layout->schema; }
int64_t BatchBuilder::batch_size() const noexcept { return impl_->layout->batch_size; }

SampleWriter& BatchBuilder::Writer(int64_t pos) {
  assert(pos >= 0 && pos < batch_size());
  impl_->Take();
  impl_->started[size_t(pos)] = 1;
  impl_->writers[size_t(pos)] = impl_->layout->Writer(impl_->slot.get(), pos);
  return impl_->writers[size_t(pos)];
}

int64_t* BatchBuilder::indices() {
  impl_->Take();
  return impl_->slot->indices.data();
}

absl::StatusOr<Batch> BatchBuilder::Finish(int64_t n, int64_t index, int64_t epoch) {
  if (n < 1 || n > batch_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchBuilder::Finish: ", n, " samples, the batch holds 1 to ", batch_size()));
  }
  impl_->Take();
  for (int64_t i = 0; i < n; ++i) {
    absl::Status s = impl_->started[size_t(i)]
                         ? internal::SlotLayout::CheckWritten(impl_->writers[size_t(i)])
                         : absl::InvalidArgumentError("no field written");
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("sample ", i, " of the batch: ", s.message()));
    }
  }
  internal::AssembleBatch(impl_->slot.get(), n, &impl_->scratch);
  impl_->pool->MarkHandedOut(impl_->slot.get());
  Batch b;
  b.slot_ = std::move(impl_->slot);
  b.size_ = n;
  b.index_ = index;
  b.epoch_ = epoch;
  return b;
}

}  // namespace feedline
