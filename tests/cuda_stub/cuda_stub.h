// A CUDA runtime of our own for tests on machines without a GPU: the functions of cudart that
// src/cuda/ calls, implemented over host memory and a simulated device thread, so that the real
// copy stage (src/cuda/device_cuda.cc, compiled a second time into the stub's test program) runs
// here: its streams, events, buffer reuse, device guards and error paths.
//
// The simulated GPU runs the operations queued on streams (copies, event records, waits for
// events, the conversion kernel, test checks) on one thread, in each stream's order, and takes
// the first runnable stream in creation order: the copy stage's stream (made when a loader is
// made) runs ahead of streams made later, so a consumer's work that is not ordered by an event
// sees its buffer overwritten. `Hold()` stops the device (a long kernel), `Resume()` lets it go.
// Device memory is reserved address space without access (the host dereferencing a device
// pointer faults, as with a GPU) over a backing store that the device thread uses; a test reads
// it with `CopyToHost`.
//
// Each stream, event and allocation belongs to the device current when it was made; a call that
// uses one while another device is current is counted (`foreign_device_calls`), a kernel launch
// or an event record that mixes devices fails as CUDA does. Faults: `FailNext(api, ...)` makes
// the next calls of one function fail; `SetSticky(e)` makes every call fail (a dead context).
//
// Thread safety: everything, from any thread.
#ifndef FEEDLINE_TESTS_CUDA_STUB_CUDA_STUB_H_
#define FEEDLINE_TESTS_CUDA_STUB_CUDA_STUB_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <string>
#include <thread>

namespace cuda_stub {

// Drops every queued operation and counter; `devices` GPUs (0: no device, as without a driver).
// Objects made before stay valid handles but belong to no device any more.
void Reset(int devices = 2);

void Hold();
void Resume();

struct Counters {
  int64_t host_allocs = 0, host_frees = 0;  // cudaHostAlloc / cudaFreeHost
  int64_t host_bytes_live = 0;
  int64_t device_allocs = 0, device_frees = 0;  // cudaMalloc / cudaFree
  int64_t device_bytes_live = 0;
  int64_t copies = 0;                // copies executed by the device
  int64_t device_syncs = 0;          // cudaDeviceSynchronize calls
  int64_t foreign_device_calls = 0;  // an object used while another device was current
  int64_t timed_records = 0;         // records of events with timing enabled
};
Counters Get();

// The next `count` calls of `api` ("cudaHostAlloc", "cudaMemcpyAsync", ...), after `skip` calls
// that succeed, return `error`.
void FailNext(const std::string& api, cudaError_t error, int count = 1, int skip = 0);
// The same for the calls of `api` on `stream` only (cudaEventRecord, cudaMemcpyAsync,
// cudaStreamWaitEvent).
void FailNextOn(const std::string& api, cudaStream_t stream, cudaError_t error, int count = 1);
// Every call returns `error` from now on (cudaSuccess: back to normal).
void SetSticky(cudaError_t error);

// Queues `check` on `stream` (a test's stand-in for the consumer's kernel): it runs on the
// device thread when the stream reaches it, after the waits queued before it.
void Enqueue(cudaStream_t stream, std::function<void()> check);

// The device of the calling thread as the stub sees it (cudaGetDevice).
int Current();

// Whether thread `id` called cudaFree since the last Reset.
bool FreedOn(std::thread::id id);

// Reads device memory now (no stream order: synchronise first, or call it from a check on a
// stream). The host cannot dereference device pointers: their addresses have no access.
void CopyToHost(void* dst, const void* device_src, size_t bytes);

}  // namespace cuda_stub

#endif  // FEEDLINE_TESTS_CUDA_STUB_CUDA_STUB_H_
