// The CUDA implementation of src/cuda/device.h (built when CMake finds the CUDA toolkit).
#include <cuda_runtime.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/normalize.h"
#include "cuda/convert_kernel.h"
#include "cuda/device.h"
#include "feedline/batch.h"
#include "feedline/error.h"

namespace feedline::cuda {
namespace {

absl::Status CudaError(cudaError_t e, absl::string_view what) {
  return MarkDeviceError(absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(e))));
}

#define FEEDLINE_CUDA_RETURN(expr)                      \
  do {                                                  \
    cudaError_t _e = (expr);                            \
    if (_e != cudaSuccess) return CudaError(_e, #expr); \
  } while (0)

// Selects `device` for the guard's lifetime and restores the caller's current device after:
// the loader never moves the calling thread's later CUDA work (torch's included) to its GPU.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) : device_(device) {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = -1;
    status_ = previous_ == device_ ? cudaSuccess : cudaSetDevice(device_);
  }
  ~DeviceGuard() {
    if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;
  cudaError_t status() const { return status_; }

 private:
  int device_;
  int previous_ = -1;
  cudaError_t status_ = cudaSuccess;
};

class PinnedAllocator final : public HostAllocator {
 public:
  explicit PinnedAllocator(int device) : device_(device) {}
  void* Allocate(size_t bytes, Fill) override {  // pinned: resident whole, whatever is written
    DeviceGuard guard(device_);
    void* p = nullptr;
    // std::bad_alloc is caught where a slot is opened: the batch fails, the process does not.
    if (guard.status() != cudaSuccess ||
        cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      throw std::bad_alloc();
    }
    return p;
  }
  void Free(void* p, size_t) override { cudaFreeHost(p); }
  const char* name() const override { return "cudaHostAlloc"; }

 private:
  int device_;
};

// One device buffer: a column per field (the image field: its uint8 staging copy and the
// converted images; uint8 NHWC needs no staging: the slot's bytes are the output).
struct Buffer {
  void* memory = nullptr;
  size_t bytes = 0;
  std::vector<void*> fields;
  uint8_t* staging = nullptr;
  // `ready` (what consumers wait on) and `released` have timing off: a timed event costs more to
  // record and to wait on. One copy in kTimeEvery is timed with `start`/`stop` for copy_ms().
  cudaEvent_t ready = nullptr, released = nullptr, start = nullptr, stop = nullptr;
  bool has_release = false;
  bool timed = false;  // start/stop hold a measurement not yet read
};

class CudaCopyStage;

// Runs what it is given on a thread of its own, one at a time: a copy stage whose last owner is
// a device batch dropped by the training loop after its loader is gone is torn down there
// (cudaFree synchronises the device), not on the loop's thread. Started on first use; a forked
// child makes its own (fresh queue and lock: the parent's reaper may have held its lock at the
// fork); never joined (at exit the process frees the device anyway). The lock that guards the
// start is held across fork() (pthread_atfork): another thread inside Get() at the fork would
// otherwise leave the child's copy locked for good.
class Reaper {
 public:
  static void Run(std::function<void()> job) {
    Queue* q = Get();
    std::lock_guard<std::mutex> lock(q->mu);
    q->jobs.push_back(std::move(job));
    q->cv.notify_one();
  }

 private:
  struct Queue {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> jobs;
  };
  static std::mutex& InitMutex() {
    static std::mutex* init = new std::mutex();
    return *init;
  }
  static int RegisterForkHandlers() {
    return pthread_atfork([] { InitMutex().lock(); }, [] { InitMutex().unlock(); },
                          [] { InitMutex().unlock(); });
  }
  static Queue* Get() {
    static const int registered = RegisterForkHandlers();
    (void)registered;
    static Queue* queue = nullptr;
    static pid_t owner = 0;
    std::lock_guard<std::mutex> lock(InitMutex());
    if (owner != ::getpid()) {
      owner = ::getpid();
      queue = new Queue();
      std::thread([q = queue] {
        for (;;) {
          std::function<void()> next;
          {
            std::unique_lock<std::mutex> l(q->mu);
            q->cv.wait(l, [q] { return !q->jobs.empty(); });
            next = std::move(q->jobs.front());
            q->jobs.pop_front();
          }
          next();
          next = nullptr;  // what it captured dies here
        }
      }).detach();
    }
    return queue;
  }
};

class CudaDeviceBatch final : public DeviceCopy {
 public:
  CudaDeviceBatch(CudaCopyStage* stage, std::shared_ptr<CudaCopyStage> keep, Buffer* buffer)
      : stage_(stage), keep_(std::move(keep)), buffer_(buffer) {}
  ~CudaDeviceBatch() override;
  // Submit failed and took the buffer back: the destructor must not release it again.
  void Disarm() { buffer_ = nullptr; }
  // `stream` as the DLPack protocol names streams: a cudaStream_t, null or 1 (the legacy
  // default stream), 2 (the calling thread's per-thread default stream), or kNoSyncStream (-1:
  // the consumer synchronises itself; nothing to wait on here).
  absl::Status UseOnStream(void* stream) override {
    DeviceGuard guard(device);  // the event and the stream are this device's
    FEEDLINE_CUDA_RETURN(guard.status());
    std::lock_guard<std::mutex> lock(mu_);
    if (stream == kNoSyncStream) {
      // Unknown consumer streams: the buffer is reused only after the whole device is idle.
      release_ = Release::kAfterDeviceSync;
      return absl::OkStatus();
    }
    const auto s = static_cast<cudaStream_t>(stream);
    FEEDLINE_CUDA_RETURN(cudaStreamWaitEvent(s, buffer_->ready, 0));
    if (s == cudaStreamPerThread) {
      // Which thread's per-thread stream is not known at release (the batch may be dropped on
      // another thread): record the release on the legacy stream instead, which waits for
      // every blocking stream, per-thread default streams included.
      stream_ = nullptr;
    } else {
      stream_ = s == cudaStreamLegacy ? nullptr : s;
    }
    release_ = Release::kOnStream;
    return absl::OkStatus();
  }

 private:
  CudaCopyStage* stage_;
  std::shared_ptr<CudaCopyStage> keep_;
  Buffer* buffer_;
  std::mutex mu_;
  cudaStream_t stream_ = nullptr;  // legacy default stream unless told otherwise
  enum class Release { kOnStream, kAfterDeviceSync } release_ = Release::kOnStream;
};

class CudaCopyStage final : public std::enable_shared_from_this<CudaCopyStage> {
 public:
  CudaCopyStage(int device, DeviceStageSpec spec)
      : device_(device),
        spec_(std::move(spec)),
        image_(spec_.conversions.empty() ? std::nullopt
                                         : std::optional<DeviceConversion>(spec_.conversions[0])) {
    if (image_) norm_ = Normalization::From(image_->mean, image_->std);
  }
  ~CudaCopyStage() {
    DeviceGuard guard(device_);
    if (stream_ == nullptr) return;  // Init failed: nothing was made
    cudaStreamSynchronize(stream_);
    copying_.clear();  // the copies are done (or the context is gone): the slots may go
    for (Buffer* b : all_) {
      for (cudaEvent_t e : {b->ready, b->released, b->start, b->stop}) {
        if (e != nullptr) cudaEventDestroy(e);
      }
      cudaFree(b->memory);
      delete b;
    }
    cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    DeviceGuard guard(device_);
    FEEDLINE_CUDA_RETURN(guard.status());
    if (cudaError_t e = CheckConvertKernel(); e != cudaSuccess) {
      cudaDeviceProp p;
      std::string name = "?";
      int cc = 0;
      if (cudaGetDeviceProperties(&p, device_) == cudaSuccess)
        name = p.name, cc = p.major * 10 + p.minor;
      return MarkDeviceError(absl::FailedPreconditionError(absl::StrCat(
          "device: cuda:", device_, " (", name, ", compute capability ", cc / 10, ".", cc % 10,
          ") cannot run this build's CUDA kernels (sm_80, sm_90 and PTX; a CUDA 13 driver, "
          "R580 or newer, is needed): ",
          cudaGetErrorString(e))));
    }
    FEEDLINE_CUDA_RETURN(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return absl::OkStatus();
  }

  int device() const { return device_; }

  absl::StatusOr<std::shared_ptr<DeviceCopy>> Submit(HostBatch host) {
    if (host.fields.size() != size_t(spec_.schema.size()) || host.size < 0 ||
        host.size > spec_.batch_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("device: a batch of ", host.fields.size(), " fields and ", host.size,
                       " samples, for a stage made for ", spec_.schema.size(), " fields and ",
                       spec_.batch_size, " samples"));
    }
    DeviceGuard guard(device_);
    FEEDLINE_CUDA_RETURN(guard.status());
    ReturnCopied(/*wait_ns=*/0);
    absl::StatusOr<Buffer*> buffer = Acquire();
    if (!buffer.ok()) return buffer.status();
    Buffer* b = *buffer;
    auto batch = std::make_shared<CudaDeviceBatch>(this, shared_from_this(), b);
    batch->device = device_;
    const bool timed = batches_.load() % kTimeEvery == 0;
    absl::Status st = Enqueue(host, b, timed, batch.get());
    if (!st.ok()) {
      // The copy may have started: the pinned memory must not go back to its owner while the
      // device still reads it, so wait for the stream (whatever it says) before giving up.
      // The buffer keeps its release event: the failure may have come before the wait for the
      // consumer's work on its previous batch, which its next copy must still wait for.
      cudaStreamSynchronize(stream_);
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      batch->Disarm();
      return st;
    }
    std::lock_guard<std::mutex> lock(mu_);
    b->timed = timed;  // copy_ms() reads it from any thread
    batch->ready_event = b->ready;
    // The host memory goes back to its owner (the slot to the ring) once this copy is done
    // (ReturnCopied), not when the batch dies: the batch keeps only its device buffer.
    copying_.push_back(Copying{b->ready, std::move(host.owner)});
    batches_.fetch_add(1);
    return std::shared_ptr<DeviceCopy>(std::move(batch));
  }

  void Release(Buffer* b, cudaStream_t consumer, bool after_device_sync) {
    DeviceGuard guard(device_);
    if (after_device_sync) {
      // The consumer's streams are unknown (DLPack stream -1): reuse once the device is idle,
      // or never (freed with the stage) when even that fails.
      if (cudaDeviceSynchronize() != cudaSuccess) return;
      b->has_release = false;
      std::lock_guard<std::mutex> lock(mu_);
      free_.push_back(b);
      return;
    }
    // Reuse only after the consumer's work queued so far, and after our own copy. When the
    // event cannot be recorded, wait for the consumer's stream instead; when even that fails,
    // the buffer is not reused (freed with the stage).
    b->has_release = cudaEventRecord(b->released, consumer) == cudaSuccess;
    if (!b->has_release && cudaStreamSynchronize(consumer) != cudaSuccess) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(b);
  }

  int64_t device_bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    int64_t total = 0;
    for (Buffer* b : all_) total += int64_t(b->bytes);
    return total;
  }
  // The copies' GPU time: the timed ones' mean times every copy.
  double copy_ms() const {
    DeviceGuard guard(device_);
    std::lock_guard<std::mutex> lock(mu_);
    for (Buffer* b : all_) Harvest(b);
    if (timed_copies_ == 0) return 0;
    return timed_ms_ / double(timed_copies_) * double(batches_.load());
  }
  int64_t batches() const { return batches_.load(); }

 private:
  absl::Status Enqueue(const HostBatch& host, Buffer* b, bool timed, DeviceCopy* batch) {
    const int64_t n = host.size;
    if (b->has_release) FEEDLINE_CUDA_RETURN(cudaStreamWaitEvent(stream_, b->released, 0));
    if (timed) FEEDLINE_CUDA_RETURN(cudaEventRecord(b->start, stream_));
    const Schema& schema = spec_.schema;
    batch->columns.resize(size_t(schema.size()));
    for (int f = 0; f < schema.size(); ++f) {
      const HostBatch::Field& c = host.fields[size_t(f)];
      DeviceCopy::Column& out = batch->columns[size_t(f)];
      int64_t elems = 1;
      for (int64_t d : c.shape) elems *= d;
      const size_t bytes = size_t(elems) * size_t(ElementSize(schema.field(f).dtype()));
      if (elems < 0 || int64_t(bytes) > spec_.field_bytes[size_t(f)]) {
        return absl::InvalidArgumentError(
            absl::StrCat("device: field \"", schema.field(f).name(), "\" of ", bytes,
                         " bytes, beyond the ", spec_.field_bytes[size_t(f)], " its buffer holds"));
      }
      if (image_ && f == image_->field) {
        const int64_t hw = int64_t(image_->size) * image_->size;
        const DType t = image_->dtype;
        const bool nchw = image_->layout == Layout::kNCHW;
        const bool as_is = !Staged();
        FEEDLINE_CUDA_RETURN(cudaMemcpyAsync(as_is ? b->fields[size_t(f)] : b->staging, c.data,
                                             size_t(n * hw * 3), cudaMemcpyHostToDevice, stream_));
        const int kind = t == DType::kFloat32    ? kConvertFloat32
                         : t == DType::kFloat16  ? kConvertFloat16
                         : t == DType::kBFloat16 ? kConvertBFloat16
                                                 : kConvertUint8;
        if (!as_is) {
          FEEDLINE_CUDA_RETURN(LaunchConvert(b->staging, b->fields[size_t(f)], n, hw, nchw, kind,
                                             norm_.scale, norm_.bias, stream_));
        }
        const int64_t s = image_->size;
        out.shape = nchw ? std::vector<int64_t>{n, 3, s, s} : std::vector<int64_t>{n, s, s, 3};
        out.dtype = t;
      } else {
        if (bytes > 0) {
          FEEDLINE_CUDA_RETURN(cudaMemcpyAsync(b->fields[size_t(f)], c.data, bytes,
                                               cudaMemcpyHostToDevice, stream_));
        }
        out.shape = c.shape;
        out.dtype = schema.field(f).dtype();
      }
      out.data = b->fields[size_t(f)];
    }
    FEEDLINE_CUDA_RETURN(cudaEventRecord(b->ready, stream_));
    if (timed) FEEDLINE_CUDA_RETURN(cudaEventRecord(b->stop, stream_));
    return absl::OkStatus();
  }

 public:
  // Drops the host memory of the copies that are done (the stream runs the copies in
  // order: the first one not done ends the walk). An error other than "not ready" (a dead
  // context) keeps the rest until the stage ends. `wait_ns` > 0: while none is done, polls
  // for up to that long (outside the lock, so that Submit goes on). Any thread (the pool's
  // reclaim hook).
  void ReturnCopied(int64_t wait_ns) {
    std::vector<std::shared_ptr<const void>> done;
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(wait_ns);
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        cudaError_t e = cudaSuccess;
        while (!copying_.empty() && (e = cudaEventQuery(copying_.front().ready)) == cudaSuccess) {
          done.push_back(std::move(copying_.front().owner));
          copying_.pop_front();
        }
        if (!done.empty() || copying_.empty() || e != cudaErrorNotReady ||
            std::chrono::steady_clock::now() >= until) {
          break;
        }
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    // `done` lets the memory go (the slots back to the pool) here, outside the lock.
  }

 private:
  // Reads a timed copy's time once it is done, without waiting for it. Under mu_.
  void Harvest(Buffer* b) const {
    float ms = 0;
    if (b->timed && cudaEventQuery(b->stop) == cudaSuccess) {
      if (cudaEventElapsedTime(&ms, b->start, b->stop) == cudaSuccess) {
        timed_ms_ += ms;
        ++timed_copies_;
      }
      b->timed = false;
    }
  }

  // The image field goes through a staging buffer and the conversion kernel, except uint8
  // NHWC: the slot's own layout, copied straight to its place.
  bool Staged() const {
    return image_ && !(image_->dtype == DType::kUint8 && image_->layout == Layout::kNHWC);
  }

  absl::StatusOr<Buffer*> Acquire() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        Buffer* b = free_.back();
        free_.pop_back();
        Harvest(b);
        b->timed = false;  // not done yet: this measurement is dropped, the next one counts
        return b;
      }
    }
    auto b = std::make_unique<Buffer>();
    auto align = [](size_t x) { return (x + 255) / 256 * 256; };
    const Schema& schema = spec_.schema;
    const size_t batch = size_t(spec_.batch_size);
    std::vector<size_t> offsets;
    size_t at = 0;
    for (int f = 0; f < schema.size(); ++f) {
      offsets.push_back(at);
      size_t bytes = size_t(spec_.field_bytes[size_t(f)]);
      if (image_ && f == image_->field) {
        bytes = size_t(image_->size) * size_t(image_->size) * 3 * batch *
                size_t(ElementSize(image_->dtype));
      }
      at += align(bytes);
    }
    const size_t staging_at = at;
    const bool staged = Staged();
    if (staged) at += align(size_t(image_->size) * size_t(image_->size) * 3 * batch);
    b->bytes = std::max<size_t>(at, 256);
    FEEDLINE_CUDA_RETURN(cudaMalloc(&b->memory, b->bytes));
    auto* base = static_cast<uint8_t*>(b->memory);
    for (size_t off : offsets) b->fields.push_back(base + off);
    if (staged) b->staging = base + staging_at;
    {
      std::lock_guard<std::mutex> lock(mu_);
      all_.push_back(b.get());  // freed with the stage, whatever fails below
    }
    Buffer* out = b.release();
    FEEDLINE_CUDA_RETURN(cudaEventCreateWithFlags(&out->ready, cudaEventDisableTiming));
    FEEDLINE_CUDA_RETURN(cudaEventCreateWithFlags(&out->released, cudaEventDisableTiming));
    FEEDLINE_CUDA_RETURN(cudaEventCreate(&out->start));
    FEEDLINE_CUDA_RETURN(cudaEventCreate(&out->stop));
    return out;
  }

  const int device_;
  const DeviceStageSpec spec_;
  const std::optional<DeviceConversion> image_;
  Normalization norm_{};
  cudaStream_t stream_ = nullptr;
  static constexpr int64_t kTimeEvery = 8;
  mutable std::mutex mu_;
  std::vector<Buffer*> all_;
  std::vector<Buffer*> free_;
  struct Copying {
    cudaEvent_t ready;
    std::shared_ptr<const void> owner;  // the host memory copied from
  };
  std::deque<Copying> copying_;  // submission order
  mutable double timed_ms_ = 0;
  mutable int64_t timed_copies_ = 0;
  std::atomic<int64_t> batches_{0};
};

CudaDeviceBatch::~CudaDeviceBatch() {
  if (buffer_ == nullptr) return;  // disarmed: Submit failed and took the buffer back
  // No wait here: the buffer's next copy is queued after this one on the stage's stream, and
  // after the consumer's work through the release event.
  stage_->Release(buffer_, stream_, release_ == Release::kAfterDeviceSync);
  // The last batch of a loader that is gone: the stage's teardown goes to the reaper. (Two
  // batches dropped at once on two threads may both see two owners: then the later one tears
  // down here, as before.)
  if (keep_.use_count() == 1) Reaper::Run([stage = std::move(keep_)]() mutable { stage.reset(); });
}

}  // namespace

bool Compiled() { return true; }

std::vector<DeviceInfo> Devices(std::string* why_none) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  std::vector<DeviceInfo> out;
  if (e != cudaSuccess) {
    if (why_none)
      *why_none = absl::StrCat("no CUDA device/driver available: ", cudaGetErrorString(e));
    return out;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) continue;
    out.push_back(DeviceInfo{i, p.name, int64_t(p.totalGlobalMem), p.major * 10 + p.minor});
  }
  if (out.empty() && why_none) *why_none = "no CUDA device found";
  return out;
}

absl::Status CheckDevice(int index) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    return MarkDeviceError(absl::FailedPreconditionError(
        absl::StrCat("device: cuda:", index, " requested, but no CUDA device/driver is available (",
                     cudaGetErrorString(e), "); use device=\"cpu\"")));
  }
  if (index >= count) {
    return MarkDeviceError(absl::FailedPreconditionError(absl::StrCat(
        "device: cuda:", index, " requested, but this machine has ", count, " CUDA device(s)")));
  }
  return absl::OkStatus();
}

HostAllocator* PinnedHostAllocator(int device) {
  static std::mutex mu;
  static std::map<int, PinnedAllocator*>* allocators = new std::map<int, PinnedAllocator*>();
  std::lock_guard<std::mutex> lock(mu);
  auto [it, inserted] = allocators->try_emplace(device, nullptr);
  if (inserted) it->second = new PinnedAllocator(device);
  return it->second;
}

int CurrentDevice() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 0;
  return device;
}

absl::StatusOr<std::unique_ptr<CopyStage>> CopyStage::Create(int device, DeviceStageSpec spec) {
  if (absl::Status s = CheckConversions(spec); !s.ok()) return s;
  if (spec.field_bytes.size() != size_t(spec.schema.size())) {
    return absl::InvalidArgumentError("device: the stage's spec needs one size per field");
  }
  if (absl::Status s = CheckDevice(device); !s.ok()) return s;
  // Owned through a shared_ptr (device batches keep the stage alive); the unique_ptr handed
  // out holds a forwarding shell.
  auto stage = std::make_shared<CudaCopyStage>(device, std::move(spec));
  if (absl::Status s = stage->Init(); !s.ok()) return s;
  class Shell final : public CopyStage {
   public:
    explicit Shell(std::shared_ptr<CudaCopyStage> s) : s_(std::move(s)) {}
    int device() const override { return s_->device(); }
    absl::StatusOr<std::shared_ptr<DeviceCopy>> Submit(HostBatch batch) override {
      return s_->Submit(std::move(batch));
    }
    int64_t device_bytes() const override { return s_->device_bytes(); }
    double copy_ms() const override { return s_->copy_ms(); }
    int64_t batches() const override { return s_->batches(); }
    void ReturnCopied(int64_t wait_ns) override { s_->ReturnCopied(wait_ns); }

   private:
    std::shared_ptr<CudaCopyStage> s_;
  };
  return std::unique_ptr<CopyStage>(new Shell(std::move(stage)));
}

}  // namespace feedline::cuda
