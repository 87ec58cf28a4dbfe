#include "core/host_allocator.h"

#include <cstdlib>
#include <new>

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

}  // namespace feedline
