// The CUDA runtime stub (cuda_stub.h): cudart's functions that src/cuda/ calls, with C linkage
// as declared by cuda_runtime_api.h, and the conversion kernel's launcher.
#include "cuda_stub.h"

#include <sys/mman.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <vector>

#include "core/float16.h"
#include "cuda/convert_kernel.h"

namespace cuda_stub {
namespace {

struct Event {
  int device = 0;
  bool timing = true;
  uint64_t recorded = 0;  // generation of the last record queued (0: never recorded)
  uint64_t done = 0;      // generation of the last record the device reached
  double at_ms = 0;
};

struct Op {
  enum Kind { kRun, kRecord, kWait } kind = kRun;
  std::function<void()> run;
  Event* event = nullptr;
  uint64_t generation = 0;
};

struct Stream {
  int device = 0;
  std::deque<Op> ops;  // the front one runs (or waits) first
};

struct Fault {
  cudaError_t error = cudaSuccess;
  int count = 0;
  int skip = 0;
  bool any_stream = true;
  cudaStream_t stream = nullptr;  // !any_stream: only calls on this stream
};

struct State {
  std::mutex mu;
  std::condition_variable cv;
  int devices = 2;
  bool held = false;
  bool busy = false;              // the device thread runs an operation outside the lock
  std::vector<Stream*> streams;   // creation order: the device's preference
  std::map<int, Stream*> legacy;  // each device's legacy default stream
  std::set<Event*> events;
  struct DeviceMemory {
    size_t bytes = 0;
    int device = 0;
    uint8_t* backing = nullptr;  // what the device reads and writes
  };
  std::map<uintptr_t, DeviceMemory> device_memory;  // by the address handed out
  std::map<void*, size_t> host_memory;
  std::map<std::string, Fault> faults;
  cudaError_t sticky = cudaSuccess;
  std::set<std::thread::id> freed_on;
  uint64_t generation = 0;
  Counters counters;
  bool started = false;
};

State& S() {
  static State* state = new State();  // never destroyed: the device thread outlives main()
  return *state;
}

thread_local int current = 0;

double NowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The stream's front operation can run: not a wait for an event the device has not reached.
bool Runnable(const Stream* s) {
  if (s->ops.empty()) return false;
  const Op& op = s->ops.front();
  return op.kind != Op::kWait || op.event->done >= op.generation;
}

Stream* FindRunnable(State& st) {
  for (Stream* s : st.streams) {
    if (Runnable(s)) return s;
  }
  return nullptr;
}

void DeviceThread() {
  State& st = S();
  std::unique_lock<std::mutex> lock(st.mu);
  for (;;) {
    st.cv.wait(lock, [&] { return !st.held && FindRunnable(st) != nullptr; });
    Stream* s = FindRunnable(st);
    Op op = std::move(s->ops.front());
    if (op.kind == Op::kRun) {
      st.busy = true;
      lock.unlock();
      op.run();
      op.run = nullptr;  // what it captured dies here, outside the lock (it may call the stub)
      lock.lock();
      st.busy = false;
    } else if (op.kind == Op::kRecord) {
      op.event->done = std::max(op.event->done, op.generation);
      op.event->at_ms = NowMs();
    }
    s->ops.pop_front();
    st.cv.notify_all();
  }
}

// Waits under `lock` until `done`; a test that never lets the device run would hang: abort with
// the reason instead.
template <typename Pred>
void WaitFor(std::unique_lock<std::mutex>& lock, Pred done, const char* what) {
  State& st = S();
  if (!st.cv.wait_for(lock, std::chrono::seconds(30), done)) {
    std::fprintf(stderr, "cuda_stub: %s did not finish in 30 s (device held: %d)\n", what,
                 int(st.held));
    std::abort();
  }
}

// Every entry point starts here: the sticky error, then a planned fault of this function (on
// `stream`, for the functions that take one).
cudaError_t Enter(State& st, const char* api, cudaStream_t stream = nullptr) {
  if (!st.started) {
    st.started = true;
    std::thread(DeviceThread).detach();
  }
  if (st.sticky != cudaSuccess) return st.sticky;
  auto it = st.faults.find(api);
  if (it == st.faults.end()) return cudaSuccess;
  Fault& f = it->second;
  if (!f.any_stream && f.stream != stream) return cudaSuccess;
  if (f.skip > 0) {
    --f.skip;
    return cudaSuccess;
  }
  if (f.count > 0) {
    --f.count;
    return f.error;
  }
  return cudaSuccess;
}

Stream* LegacyStream(State& st, int device) {
  Stream*& s = st.legacy[device];
  if (s == nullptr) {
    s = new Stream();
    s->device = device;
    st.streams.push_back(s);
  }
  return s;
}

// A stream handle as CUDA takes it: null and 1 (legacy) and 2 (per-thread; the stub has one
// default stream per device) are the current device's default stream.
Stream* Resolve(State& st, cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    return LegacyStream(st, current);
  }
  auto* s = reinterpret_cast<Stream*>(handle);
  return std::find(st.streams.begin(), st.streams.end(), s) != st.streams.end() ? s : nullptr;
}

Event* FindEvent(State& st, cudaEvent_t handle) {
  auto* e = reinterpret_cast<Event*>(handle);
  return st.events.count(e) ? e : nullptr;
}

void NoteDevice(State& st, int device) {
  if (device != current) ++st.counters.foreign_device_calls;
}

// The backing store of device range [p, p + n) of `device` (any device: -1), or null.
uint8_t* Translate(State& st, const void* p, size_t n, int device) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  auto it = st.device_memory.upper_bound(at);
  if (it == st.device_memory.begin()) return nullptr;
  --it;
  const State::DeviceMemory& m = it->second;
  if ((device >= 0 && m.device != device) || at + n > it->first + m.bytes) return nullptr;
  return m.backing + (at - it->first);
}

void WaitDeviceIdle(State& st, std::unique_lock<std::mutex>& lock, int device, const char* what) {
  WaitFor(
      lock,
      [&] {
        if (st.busy) return false;
        for (Stream* s : st.streams) {
          if (s->device == device && !s->ops.empty()) return false;
        }
        return true;
      },
      what);
}

}  // namespace

void Reset(int devices) {
  State& st = S();
  std::unique_lock<std::mutex> lock(st.mu);
  WaitFor(
      lock, [&] { return !st.busy; }, "Reset");
  for (Stream* s : st.streams) s->ops.clear();
  st.devices = devices;
  st.held = false;
  st.faults.clear();
  st.sticky = cudaSuccess;
  st.freed_on.clear();
  st.counters = Counters();
  current = 0;
  st.cv.notify_all();
}

void Hold() {
  std::lock_guard<std::mutex> lock(S().mu);
  S().held = true;
}

void Resume() {
  std::lock_guard<std::mutex> lock(S().mu);
  S().held = false;
  S().cv.notify_all();
}

Counters Get() {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().counters;
}

void FailNext(const std::string& api, cudaError_t error, int count, int skip) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().faults[api] = Fault{error, count, skip, true, nullptr};
}

void FailNextOn(const std::string& api, cudaStream_t stream, cudaError_t error, int count) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().faults[api] = Fault{error, count, 0, false, stream};
}

void SetSticky(cudaError_t error) {
  std::lock_guard<std::mutex> lock(S().mu);
  S().sticky = error;
}

void Enqueue(cudaStream_t stream, std::function<void()> check) {
  State& st = S();
  std::lock_guard<std::mutex> lock(st.mu);
  (void)Enter(st, "Enqueue");
  Stream* s = Resolve(st, stream);
  if (s == nullptr) {
    std::fprintf(stderr, "cuda_stub::Enqueue: unknown stream\n");
    std::abort();
  }
  Op op;
  op.run = std::move(check);
  s->ops.push_back(std::move(op));
  st.cv.notify_all();
}

int Current() { return current; }

bool FreedOn(std::thread::id id) {
  std::lock_guard<std::mutex> lock(S().mu);
  return S().freed_on.count(id) > 0;
}

void CopyToHost(void* dst, const void* device_src, size_t bytes) {
  State& st = S();
  std::lock_guard<std::mutex> lock(st.mu);
  const uint8_t* src = Translate(st, device_src, bytes, -1);
  if (src == nullptr) {
    std::fprintf(stderr, "cuda_stub::CopyToHost: not device memory\n");
    std::abort();
  }
  std::memcpy(dst, src, bytes);
}

}  // namespace cuda_stub

using cuda_stub::Enter;
using cuda_stub::S;
using cuda_stub::State;

#define STUB_ENTER_ON(name, stream)         \
  State& st = S();                          \
  std::unique_lock<std::mutex> lock(st.mu); \
  if (cudaError_t entered = Enter(st, name, stream); entered != cudaSuccess) return entered
#define STUB_ENTER(name) STUB_ENTER_ON(name, nullptr)

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory (stub)";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected (stub)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (stub)";
    case cudaErrorNotReady:
      return "device not ready (stub)";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered (stub)";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle (stub)";
    case cudaErrorInvalidValue:
      return "invalid argument (stub)";
    default:
      return "CUDA error (stub)";
  }
}

cudaError_t cudaGetDeviceCount(int* count) {
  STUB_ENTER("cudaGetDeviceCount");
  *count = st.devices;
  return st.devices == 0 ? cudaErrorNoDevice : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  STUB_ENTER("cudaGetDevice");
  *device = cuda_stub::current;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  STUB_ENTER("cudaSetDevice");
  if (device < 0 || device >= st.devices) return cudaErrorInvalidDevice;
  cuda_stub::current = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  STUB_ENTER("cudaGetDeviceProperties");
  if (device < 0 || device >= st.devices) return cudaErrorInvalidDevice;
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "feedline CUDA stub %d", device);
  prop->totalGlobalMem = size_t{80} << 30;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  STUB_ENTER("cudaDeviceSynchronize");
  ++st.counters.device_syncs;
  cuda_stub::WaitDeviceIdle(st, lock, cuda_stub::current, "cudaDeviceSynchronize");
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** ptr, size_t bytes, unsigned int) {
  STUB_ENTER("cudaHostAlloc");
  *ptr = std::aligned_alloc(4096, (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096);
  if (*ptr == nullptr) return cudaErrorMemoryAllocation;
  st.host_memory[*ptr] = bytes;
  ++st.counters.host_allocs;
  st.counters.host_bytes_live += int64_t(bytes);
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void* ptr) {
  STUB_ENTER("cudaFreeHost");
  auto it = st.host_memory.find(ptr);
  if (it == st.host_memory.end()) return cudaErrorInvalidValue;
  ++st.counters.host_frees;
  st.counters.host_bytes_live -= int64_t(it->second);
  st.host_memory.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  STUB_ENTER("cudaMalloc");
  // The address handed out is reserved address space without access: the host dereferencing a
  // device pointer faults, as with a real GPU. The device works on a backing store.
  const size_t rounded = (std::max<size_t>(bytes, 1) + 4095) / 4096 * 4096;
  void* address =
      mmap(nullptr, rounded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (address == MAP_FAILED) return cudaErrorMemoryAllocation;
  auto* backing = static_cast<uint8_t*>(std::aligned_alloc(4096, rounded));
  if (backing == nullptr) {
    munmap(address, rounded);
    return cudaErrorMemoryAllocation;
  }
  *ptr = address;
  st.device_memory[reinterpret_cast<uintptr_t>(address)] = {bytes, cuda_stub::current, backing};
  ++st.counters.device_allocs;
  st.counters.device_bytes_live += int64_t(bytes);
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  STUB_ENTER("cudaFree");
  if (ptr == nullptr) return cudaSuccess;
  st.freed_on.insert(std::this_thread::get_id());
  auto it = st.device_memory.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == st.device_memory.end()) return cudaErrorInvalidValue;
  const State::DeviceMemory m = it->second;
  cuda_stub::NoteDevice(st, m.device);
  // cudaFree waits for the device, as CUDA's does.
  cuda_stub::WaitDeviceIdle(st, lock, m.device, "cudaFree");
  ++st.counters.device_frees;
  st.counters.device_bytes_live -= int64_t(m.bytes);
  st.device_memory.erase(reinterpret_cast<uintptr_t>(ptr));
  munmap(ptr, (std::max<size_t>(m.bytes, 1) + 4095) / 4096 * 4096);
  std::free(m.backing);
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  STUB_ENTER("cudaStreamCreateWithFlags");
  auto* s = new cuda_stub::Stream();
  s->device = cuda_stub::current;
  st.streams.push_back(s);
  *stream = reinterpret_cast<cudaStream_t>(s);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  STUB_ENTER("cudaStreamDestroy");
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return cudaErrorInvalidResourceHandle;  // a default stream is not destroyed
  }
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  cuda_stub::NoteDevice(st, s->device);
  cuda_stub::WaitFor(
      lock, [&] { return s->ops.empty() && !st.busy; }, "cudaStreamDestroy");
  st.streams.erase(std::find(st.streams.begin(), st.streams.end(), s));
  delete s;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  STUB_ENTER("cudaStreamSynchronize");
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  cuda_stub::NoteDevice(st, s->device);
  cuda_stub::WaitFor(
      lock, [&] { return s->ops.empty(); }, "cudaStreamSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  STUB_ENTER("cudaEventCreateWithFlags");
  auto* e = new cuda_stub::Event();
  e->device = cuda_stub::current;
  e->timing = (flags & cudaEventDisableTiming) == 0;
  st.events.insert(e);
  *event = reinterpret_cast<cudaEvent_t>(e);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  STUB_ENTER("cudaEventDestroy");
  if (event == nullptr) return cudaErrorInvalidResourceHandle;
  cuda_stub::Event* e = cuda_stub::FindEvent(st, event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  // CUDA lets the device finish with a destroyed event; the stub waits for it instead.
  cuda_stub::WaitFor(
      lock, [&] { return e->done >= e->recorded && !st.busy; }, "cudaEventDestroy");
  for (cuda_stub::Stream* s : st.streams) {
    for (const cuda_stub::Op& op : s->ops) {
      if (op.event == e) {
        std::fprintf(stderr, "cuda_stub: an event destroyed while a stream waits on it\n");
        std::abort();
      }
    }
  }
  st.events.erase(e);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  STUB_ENTER_ON("cudaEventRecord", stream);
  cuda_stub::Event* e = cuda_stub::FindEvent(st, event);
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (e == nullptr || s == nullptr || e->device != s->device) return cudaErrorInvalidResourceHandle;
  cuda_stub::NoteDevice(st, s->device);
  if (e->timing) ++st.counters.timed_records;
  cuda_stub::Op op;
  op.kind = cuda_stub::Op::kRecord;
  op.event = e;
  op.generation = e->recorded = ++st.generation;
  s->ops.push_back(std::move(op));
  st.cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  STUB_ENTER_ON("cudaStreamWaitEvent", stream);
  cuda_stub::Event* e = cuda_stub::FindEvent(st, event);
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (e == nullptr || s == nullptr) return cudaErrorInvalidResourceHandle;
  cuda_stub::NoteDevice(st, s->device);
  cuda_stub::Op op;
  op.kind = cuda_stub::Op::kWait;
  op.event = e;
  op.generation = e->recorded;  // the record queued last; none: nothing to wait for
  s->ops.push_back(std::move(op));
  st.cv.notify_all();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  STUB_ENTER("cudaEventQuery");
  cuda_stub::Event* e = cuda_stub::FindEvent(st, event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  return e->done >= e->recorded ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  STUB_ENTER("cudaEventSynchronize");
  cuda_stub::Event* e = cuda_stub::FindEvent(st, event);
  if (e == nullptr) return cudaErrorInvalidResourceHandle;
  const uint64_t target = e->recorded;
  cuda_stub::WaitFor(
      lock, [&] { return e->done >= target; }, "cudaEventSynchronize");
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  STUB_ENTER("cudaEventElapsedTime");
  cuda_stub::Event* a = cuda_stub::FindEvent(st, start);
  cuda_stub::Event* b = cuda_stub::FindEvent(st, end);
  if (a == nullptr || b == nullptr || !a->timing || !b->timing) {
    return cudaErrorInvalidResourceHandle;
  }
  if (a->recorded == 0 || b->recorded == 0) return cudaErrorInvalidResourceHandle;
  if (a->done < a->recorded || b->done < b->recorded) return cudaErrorNotReady;
  *ms = float(std::max(0.0, b->at_ms - a->at_ms));
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  STUB_ENTER_ON("cudaMemcpyAsync", stream);
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (s == nullptr) return cudaErrorInvalidResourceHandle;
  cuda_stub::NoteDevice(st, s->device);
  uint8_t* to = cuda_stub::Translate(st, dst, bytes, s->device);
  if (kind != cudaMemcpyHostToDevice || to == nullptr) return cudaErrorInvalidValue;
  cuda_stub::Op op;
  // The device reads the host memory when it gets there, as a DMA engine does.
  op.run = [to, src, bytes] {
    std::memcpy(to, src, bytes);
    std::lock_guard<std::mutex> l(S().mu);
    ++S().counters.copies;
  };
  s->ops.push_back(std::move(op));
  st.cv.notify_all();
  return cudaSuccess;
}

namespace feedline::cuda {

cudaError_t CheckConvertKernel() {
  STUB_ENTER("CheckConvertKernel");
  return cudaSuccess;
}

// The conversion kernel on the stub's device: the same arithmetic as convert.cu (x * scale +
// bias in float, rounded to the dtype), run by the device thread in the stream's order.
cudaError_t LaunchConvert(const uint8_t* src, void* dst, int64_t images, int64_t hw, bool nchw,
                          int dtype, const float* scale, const float* bias, cudaStream_t stream) {
  STUB_ENTER("LaunchConvert");
  cuda_stub::Stream* s = cuda_stub::Resolve(st, stream);
  if (s == nullptr || s->device != cuda_stub::current) return cudaErrorInvalidResourceHandle;
  const int64_t elements = images * hw * 3;
  const int size = dtype == kConvertUint8 ? 1 : dtype == kConvertFloat32 ? 4 : 2;
  const uint8_t* src_d = cuda_stub::Translate(st, src, size_t(elements), s->device);
  uint8_t* dst_d = cuda_stub::Translate(st, dst, size_t(elements * size), s->device);
  if (src_d == nullptr || dst_d == nullptr) return cudaErrorIllegalAddress;
  std::array<float, 3> sc{scale[0], scale[1], scale[2]}, bi{bias[0], bias[1], bias[2]};
  cuda_stub::Op op;
  op.run = [=] {
    for (int64_t i = 0; i < images; ++i) {
      for (int64_t p = 0; p < hw; ++p) {
        for (int c = 0; c < 3; ++c) {
          const uint8_t x = src_d[(i * hw + p) * 3 + c];
          const int64_t at = nchw ? (i * 3 + c) * hw + p : (i * hw + p) * 3 + c;
          const float v = float(x) * sc[c] + bi[c];
          switch (dtype) {
            case kConvertUint8:
              dst_d[at] = x;
              break;
            case kConvertFloat32:
              reinterpret_cast<float*>(dst_d)[at] = v;
              break;
            case kConvertFloat16:
              reinterpret_cast<uint16_t*>(dst_d)[at] = FloatToHalf(v);
              break;
            default:
              reinterpret_cast<uint16_t*>(dst_d)[at] = FloatToBFloat16(v);
              break;
          }
        }
      }
    }
  };
  s->ops.push_back(std::move(op));
  st.cv.notify_all();
  return cudaSuccess;
}

}  // namespace feedline::cuda
