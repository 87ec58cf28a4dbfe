// Allocates the big, long-lived host buffers (the prefetch ring's slots).
//
// The default uses 2 MiB-aligned malloc (huge pages for big slots); the CUDA build swaps in
// page-locked memory so that the copy stage's cudaMemcpyAsync is a true asynchronous DMA.
//
// Thread safety: implementations must be callable from any thread.
#ifndef FEEDLINE_SRC_CORE_HOST_ALLOCATOR_H_
#define FEEDLINE_SRC_CORE_HOST_ALLOCATOR_H_

#include <cstddef>

namespace feedline {

// How a buffer will be written. kDense: every byte (an image slot); the default allocator asks
// for huge pages, which saves page faults. kSparse: a little of each sample's extent (a slot of
// variable fields, whose samples are written at strides of their largest size): 4 KiB pages,
// so that resident memory follows what is written, not the bound. With huge pages a packed
// text loader's document slots (64 strides of 256 KiB, ~200 bytes written in each) were
// resident whole: 16 MiB each.
enum class Fill { kDense, kSparse };

class HostAllocator {
 public:
  virtual ~HostAllocator() = default;
  // Never returns null: throws std::bad_alloc when the memory cannot be had.
  virtual void* Allocate(size_t bytes, Fill fill) = 0;
  virtual void Free(void* p, size_t bytes) = 0;
  virtual const char* name() const = 0;
};

// The process-wide default (malloc-backed); never destroyed.
HostAllocator* DefaultHostAllocator();

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_HOST_ALLOCATOR_H_
