#include "pipeline/batch_slot.h"

#include <cstdlib>
#include <new>

#include "feedline/batch.h"

namespace feedline {
namespace {

class AlignedHostAllocator final : public HostAllocator {
 public:
  void* Allocate(size_t bytes) override {
    // 2 MiB alignment lets the kernel back big slots with huge pages.
    constexpr size_t kAlign = size_t{1} << 21;
    void* p = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  void Free(void* p, size_t) override { std::free(p); }
  const char* name() const override { return "malloc"; }
};

}  // namespace

HostAllocator* DefaultHostAllocator() {
  static AlignedHostAllocator allocator;
  return &allocator;
}

namespace internal {

BatchSlot::BatchSlot(HostAllocator* a, size_t bytes, int64_t batch_size)
    : allocator(a),
      images(static_cast<uint8_t*>(a->Allocate(bytes))),
      image_bytes(bytes),
      labels(size_t(batch_size)),
      indices(size_t(batch_size)) {}

BatchSlot::~BatchSlot() { allocator->Free(images, image_bytes); }

}  // namespace internal

SlotPool::~SlotPool() {
  std::lock_guard<std::mutex> lock(mu_);
  for (internal::BatchSlot* s : free_) delete s;
}

std::shared_ptr<internal::BatchSlot> SlotPool::Acquire() {
  internal::BatchSlot* slot = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!free_.empty()) {
      slot = free_.back();
      free_.pop_back();
    }
  }
  if (slot == nullptr) {
    slot = new internal::BatchSlot(allocator_, image_bytes_, batch_size_);
    allocated_.fetch_add(1, std::memory_order_relaxed);
    created_.fetch_add(1, std::memory_order_relaxed);
  }
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

int64_t SlotPool::cached() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(free_.size());
}

}  // namespace feedline
