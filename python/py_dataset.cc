// Python data sets in the engine (see py_dataset.h).
#include "py_dataset.h"

#include <poll.h>
#include <pybind11/stl.h>
#include <signal.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "feedline/error.h"
#include "wire_format.h"

namespace py = pybind11;

namespace feedline::python {

namespace {

// Samples up to this size are copied into the slot without releasing the GIL (ApplyThread).
constexpr size_t kCopyWithGilBytes = 256 << 10;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// As src/core/clock.h's (the library's private headers are not the adapter's to include).
int64_t ThreadCpuNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Three interleaved channels of `n` pixels (RGBRGB...) into three planes: a CHW view of an HWC
// image (torchvision's PILToTensor returns one), copied without torch's element-wise strided
// copy (~50 us for 224x224x3 against ~5 with AVX2, ~23 with SSE2).
__attribute__((target_clones("avx2", "default"))) void Deinterleave3(const uint8_t* src,
                                                                     uint8_t* d0, uint8_t* d1,
                                                                     uint8_t* d2, int64_t n) {
  for (int64_t x = 0; x < n; ++x) {
    d0[x] = src[3 * x];
    d1[x] = src[3 * x + 1];
    d2[x] = src[3 * x + 2];
  }
}

// Copies an array of `shape` with non-negative byte `strides` into contiguous `dst`.
void StridedCopy(const uint8_t* src, absl::Span<const int64_t> shape,
                 absl::Span<const int64_t> strides, int64_t itemsize, uint8_t* dst) {
  const int nd = int(shape.size());
  int64_t total = 1;
  for (int64_t d : shape) total *= d;
  if (total == 0) return;
  // A CHW view of an HWC byte image: its rows deinterleaved into the planes.
  if (nd == 3 && itemsize == 1 && shape[0] == 3 && strides[0] == 1 && strides[2] == 3) {
    const int64_t h = shape[1], w = shape[2];
    for (int64_t y = 0; y < h; ++y) {
      Deinterleave3(src + y * strides[1], dst + y * w, dst + (h + y) * w, dst + (2 * h + y) * w, w);
    }
    return;
  }
  // The innermost dimension: a contiguous run or an element-wise gather; an odometer over the
  // others.
  const int64_t inner = nd > 0 ? shape[size_t(nd - 1)] : 1;
  const int64_t inner_stride = nd > 0 ? strides[size_t(nd - 1)] : itemsize;
  const size_t run = size_t(inner * itemsize);
  std::vector<int64_t> at(size_t(std::max(nd - 1, 0)), 0);
  for (int64_t done = 0; done < total; done += inner) {
    int64_t off = 0;
    for (int d = 0; d + 1 < nd; ++d) off += at[size_t(d)] * strides[size_t(d)];
    const uint8_t* p = src + off;
    if (inner_stride == itemsize) {
      std::memcpy(dst, p, run);
    } else {
      for (int64_t x = 0; x < inner; ++x) {
        std::memcpy(dst + x * itemsize, p + x * inner_stride, size_t(itemsize));
      }
    }
    dst += run;
    for (int d = nd - 2; d >= 0; --d) {
      if (++at[size_t(d)] < shape[size_t(d)]) break;
      at[size_t(d)] = 0;
    }
  }
}

class Positions : public Dataset {
 public:
  Positions(int64_t n, uint64_t fingerprint) : n_(n), fingerprint_(fingerprint) {}
  int64_t size() const override { return n_; }
  absl::Status Read(int64_t, Record* record) const override {
    record->Clear();
    return absl::OkStatus();
  }
  std::string Describe(int64_t index) const override { return absl::StrCat("position ", index); }
  uint64_t Fingerprint() const override { return fingerprint_; }
  bool empty_records() const override { return true; }

 private:
  int64_t n_;
  uint64_t fingerprint_;
};

enum class Io { kOk, kEof, kTimeout, kClosed, kError };

bool WriteAll(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= size_t(w);
  }
  return true;
}

// Reads exactly n bytes, polling so that a closing loader, processes being stopped or a timeout
// (<= 0: none) ends it.
Io ReadAll(int fd, void* data, size_t n, double timeout_s, const std::atomic<bool>& closed,
           const std::atomic<bool>& stopping) {
  auto* p = static_cast<uint8_t*>(data);
  const int64_t deadline =
      timeout_s > 0 ? NowNs() + int64_t(timeout_s * 1e9) : std::numeric_limits<int64_t>::max();
  while (n > 0) {
    if (closed.load() || stopping.load()) return Io::kClosed;
    const int64_t left_ms = (deadline - NowNs()) / 1000000;
    if (left_ms < 0) return Io::kTimeout;
    pollfd pfd{fd, POLLIN, 0};
    const int r = ::poll(&pfd, 1, int(std::min<int64_t>(left_ms + 1, 200)));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Io::kError;
    if (r == 0) continue;
    const ssize_t got = ::read(fd, p, n);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got < 0) return Io::kError;
    if (got == 0) return Io::kEof;
    p += got;
    n -= size_t(got);
  }
  return Io::kOk;
}

}  // namespace

std::shared_ptr<const Dataset> MakePositions(int64_t n, uint64_t fingerprint) {
  return std::make_shared<Positions>(n, fingerprint);
}

PyTransform::PyTransform(Schema schema, bool batch_mode, py::object fetch)
    : schema_(std::move(schema)), batch_mode_(batch_mode), fetch_(std::move(fetch)) {}

PyTransform::~PyTransform() {
  StopProcesses();
  if (Py_IsInitialized() && !_Py_IsFinalizing()) {
    py::gil_scoped_acquire gil;
    fetch_ = py::object();
    respawn_ = py::object();
  } else {  // the interpreter is gone: leak the references rather than touch it
    fetch_.release();
    respawn_.release();
  }
}

// A worker thread's id, and its Python thread state, made at its first sample and kept for the
// thread's life. Without it each GIL acquisition on an engine thread (a thread Python does not
// know) makes and frees a thread state: its frame stack mapped and unmapped, thread-local data
// lost. On the PIL workload that cost ~0.5 ms of CPU per sample (2.7-3.0 ms against 2.3-2.4 ms
// in plain Python threads).
struct PyTransform::ThreadWorker : SampleTransform::WorkerState {
  ThreadWorker(const PyTransform* t, int i) : owner(t), id(i), thread(std::this_thread::get_id()) {}
  ~ThreadWorker() override {
    // Made and destroyed on the engine's worker thread (MapStage::WorkerLoop). At interpreter
    // shutdown the state is left to the interpreter: taking the GIL then would end the thread.
    if (tstate != nullptr && std::this_thread::get_id() == thread && Py_IsInitialized() != 0 &&
        _Py_IsFinalizing() == 0) {
      PyEval_RestoreThread(tstate);
      PyGILState_Release(gstate);  // the last reference: deletes the state, releases the GIL
    }
    owner->ReturnWorkerId(id);
  }
  const PyTransform* owner;
  int id;
  std::thread::id thread;
  PyThreadState* tstate = nullptr;  // this thread's, between two samples (GIL not held)
  PyGILState_STATE gstate{};
  // Processes: the last chunk reply's samples (a copy: its process is free again), for the
  // positions that follow (this thread makes its batch's positions in order).
  int64_t chunk_generation = -1, chunk_first = 0;
  std::vector<ChunkEntry> chunk_entries;
  std::vector<uint8_t> chunk_bytes;
};

// Holds the GIL for one sample: with the worker's own thread state when called on its thread
// (made by PyGILState_Ensure at the first sample and kept: pybind11's acquisitions inside find
// it), else as PyGILState_Ensure does (the consumer's thread, replacing a failed sample).
class PyTransform::GilHold {
 public:
  // `worker`: the calling thread's own ThreadWorker, or null.
  explicit GilHold(ThreadWorker* worker) : worker_(worker) {
    if (worker_ == nullptr) {
      own_ = PyGILState_Ensure();
    } else if (worker_->tstate != nullptr) {
      PyEval_RestoreThread(worker_->tstate);
    } else {
      worker_->gstate = PyGILState_Ensure();
      worker_->tstate = PyThreadState_Get();
    }
  }
  ~GilHold() {
    if (worker_ == nullptr) {
      PyGILState_Release(own_);
    } else {
      PyEval_SaveThread();
    }
  }
  GilHold(const GilHold&) = delete;
  GilHold& operator=(const GilHold&) = delete;

 private:
  ThreadWorker* worker_;
  PyGILState_STATE own_{};
};

std::unique_ptr<SampleTransform::WorkerState> PyTransform::NewWorkerState() const {
  return std::make_unique<ThreadWorker>(this, TakeWorkerId());
}

int PyTransform::TakeWorkerId() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t i = 0;
  while (i < worker_ids_.size() && worker_ids_[i]) ++i;
  if (i == worker_ids_.size()) worker_ids_.push_back(false);
  worker_ids_[i] = true;
  return int(i);
}

void PyTransform::ReturnWorkerId(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (id >= 0 && size_t(id) < worker_ids_.size()) worker_ids_[size_t(id)] = false;
}

absl::Status PyTransform::Apply(const Record&, const SampleContext& context, WorkerState* state,
                                SampleWriter& out) const {
  if (closed_.load()) return absl::CancelledError("the loader is closed");
  const int64_t position = context.index();
  absl::Status st;
  bool use_procs;
  {
    std::lock_guard<std::mutex> lock(mu_);
    use_procs = !procs_.empty();
  }
  // A sample made off the worker threads (a replacement on the consumer's thread) is worker 0's.
  auto* worker = dynamic_cast<ThreadWorker*>(state);
  st = use_procs ? ApplyProcess(position, context.epoch(), worker, out)
                 : ApplyThread(position, worker, out);
  if (st.ok()) samples_.fetch_add(1, std::memory_order_relaxed);
  return st;
}

absl::Status PyTransform::Failed(int64_t position, const std::string& text,
                                 int64_t generation) const {
  const size_t nl = text.find('\n');
  const std::string summary = text.substr(0, nl);
  {
    std::lock_guard<std::mutex> lock(mu_);
    errors_[{generation >= 0 ? generation : keys_.generation, position}] = text;
  }
  absl::Status st = absl::DataLossError(summary);
  // The Python side's error details (JSON after the summary) say `"replace": false` for a
  // failure the loop must see even under on_error="skip" (a padded field's bound exceeded).
  if (nl != std::string::npos && text.find("\"replace\": false", nl) != std::string::npos) {
    st = MarkNotReplaceable(std::move(st));
  }
  return st;
}

absl::Status PyTransform::ApplyThread(int64_t position, ThreadWorker* state,
                                      SampleWriter& out) const {
  if (Py_IsInitialized() == 0 || _Py_IsFinalizing()) {
    return absl::CancelledError("the interpreter is shutting down");
  }
  const bool own_thread = state != nullptr && state->thread == std::this_thread::get_id();
  const int worker = state != nullptr ? state->id : 0;
  const int64_t t0 = NowNs();
  GilHold gil(own_thread ? state : nullptr);
  const int64_t t1 = NowNs();
  gil_wait_ns_.fetch_add(t1 - t0, std::memory_order_relaxed);
  // The call's time off a CPU: waiting to take the GIL back after the dataset's C calls released
  // it (PIL's decode, a file read), for I/O, or for a core. Only the first acquisition is timed
  // above; with two threads on PIL's ImageFolder these waits inside are most of the GIL's cost.
  const int64_t c1 = ThreadCpuNs();
  auto account = [&] {
    const int64_t wall = NowNs() - t1;
    call_ns_.fetch_add(wall, std::memory_order_relaxed);
    off_cpu_ns_.fetch_add(std::max<int64_t>(0, wall - (ThreadCpuNs() - c1)),
                          std::memory_order_relaxed);
  };
  py::object r;
  try {
    r = fetch_(position, worker);
  } catch (py::error_already_set& e) {  // fetch reports the dataset's errors itself: a bug here
    account();
    return Failed(position,
                  absl::StrCat("feedline: internal error in fetch(", position, "): ", e.what()));
  }
  account();
  if (py::isinstance<py::str>(r)) return Failed(position, r.cast<std::string>());
  if (batch_mode_) {
    *out.Fixed<int64_t>(0) = position;
    return absl::OkStatus();
  }
  auto leaves = r.cast<py::list>();
  if (int(leaves.size()) != schema_.size()) {
    return Failed(position, absl::StrCat("feedline: fetch(", position, ") gave ", leaves.size(),
                                         " fields, the schema has ", schema_.size()));
  }
  // Take the buffers with the GIL, copy without it.
  std::vector<py::buffer_info> infos;
  infos.reserve(leaves.size());
  for (int f = 0; f < schema_.size(); ++f) {
    infos.push_back(py::reinterpret_borrow<py::buffer>(leaves[size_t(f)]).request());
    const py::buffer_info& b = infos.back();
    const Field& field = schema_.field(f);
    if (b.itemsize != ElementSize(field.dtype())) {
      return Failed(position,
                    absl::StrCat("feedline: field ", field.name(), ": element size ", b.itemsize,
                                 ", the schema's is ", ElementSize(field.dtype())));
    }
    // Strided arrays (a permuted tensor's view) are copied by StridedCopy; negative strides
    // do not come from torch.
    for (int d = 0; d < int(b.ndim); ++d) {
      if (b.strides[size_t(d)] < 0) {
        return Failed(position, absl::StrCat("feedline: field ", field.name(),
                                             ": an array with negative strides"));
      }
    }
  }
  auto contiguous = [](const py::buffer_info& b) {
    int64_t expect = b.itemsize;
    for (int d = int(b.ndim) - 1; d >= 0; --d) {
      if (b.shape[size_t(d)] > 1 && b.strides[size_t(d)] != expect) return false;
      expect *= b.shape[size_t(d)];
    }
    return true;
  };
  auto copy = [&]() -> absl::Status {
    for (int f = 0; f < schema_.size(); ++f) {
      const py::buffer_info& b = infos[size_t(f)];
      std::vector<int64_t> shape(b.shape.begin(), b.shape.end());
      absl::Status st;
      if (contiguous(b)) {
        st = out.Write(f, shape, b.ptr);
      } else {
        absl::StatusOr<void*> dst = out.Shaped(f, shape);
        st = dst.status();
        if (st.ok()) {
          static_assert(std::is_same_v<py::ssize_t, int64_t>, "buffer strides are int64");
          StridedCopy(static_cast<const uint8_t*>(b.ptr), shape, b.strides, b.itemsize,
                      static_cast<uint8_t*>(*dst));
        }
      }
      if (!st.ok()) return Failed(position, std::string(st.message()));
    }
    return absl::OkStatus();
  };
  // A small sample is copied with the GIL held: releasing it for the copy costs a second
  // acquisition (the buffers must be released with it), and under contention an acquisition is
  // a hand-off between threads (futex wake-ups, context switches) dearer than copying
  // kCopyWithGilBytes.
  size_t bytes = 0;
  for (const py::buffer_info& b : infos) bytes += size_t(b.size) * size_t(b.itemsize);
  if (bytes <= kCopyWithGilBytes) return copy();
  py::gil_scoped_release nogil;
  return copy();  // `nogil` ends first: the buffer_infos are released with the GIL
}

absl::Status PyTransform::WriteFields(const uint8_t* p, size_t n, SampleWriter& out) const {
  return ReadSampleReply(schema_, p, n, out);
}

void PyTransform::UseProcesses(py::object respawn, int count) {
  StopProcesses();
  respawn_ = std::move(respawn);
  {
    std::lock_guard<std::mutex> lock(mu_);
    procs_.assign(size_t(count), Proc());
  }
  for (int i = 0; i < count; ++i) {
    std::string old = Respawn(i);  // the GIL is held by the caller: Respawn re-enters it
    (void)old;
  }
}

void PyTransform::CloseProc(Proc& p) const {
  if (p.request_fd >= 0) {
    const int64_t bye[5] = {0, 0, 0, 0, 0};
    if (p.alive) (void)WriteAll(p.request_fd, bye, sizeof bye);
    ::close(p.request_fd);
  }
  if (p.reply_fd >= 0) ::close(p.reply_fd);
  if (p.staging != nullptr) ::munmap(p.staging, p.staging_bytes);
  p = Proc();
}

void PyTransform::StopProcesses() {
  std::unique_lock<std::mutex> lock(mu_);
  // A worker thread inside a request keeps its process's pipes and staging mapping until it
  // gives the process back: within ReadAll's poll (200 ms) once it sees `stopping_`, or after
  // copying a reply out of the staging area. Closing them under it (the loader's close() while
  // an epoch's worker was copying a sample) unmapped the staging area mid-copy: a segfault.
  stopping_.store(true);
  idle_.notify_all();
  idle_.wait(lock, [&] {
    return std::none_of(procs_.begin(), procs_.end(), [](const Proc& p) { return p.busy; });
  });
  for (Proc& p : procs_) CloseProc(p);
  procs_.clear();
  stopping_.store(false);
  idle_.notify_all();
}

int PyTransform::processes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return int(procs_.size());
}

std::string PyTransform::Respawn(int i) const {
  // Taken without the GIL (a caller may hold it: UseProcesses): the respawn that holds this
  // lock needs the GIL to start its process.
  std::unique_lock<std::mutex> spawn(spawn_mu_, std::defer_lock);
  if (PyGILState_Check()) {
    py::gil_scoped_release nogil;
    spawn.lock();
  } else {
    spawn.lock();
  }
  std::vector<int> fds;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (size_t(i) >= procs_.size()) return "";  // stopped, or adopted by another transform
    CloseProc(procs_[size_t(i)]);
    if (stopping_.load()) {  // no new process while they are being stopped
      idle_.notify_all();
      return "";
    }
    procs_[size_t(i)].respawning = true;  // a request for this process waits for the new one
    for (const Proc& p : procs_) {
      if (p.request_fd >= 0) fds.push_back(p.request_fd);
      if (p.reply_fd >= 0) fds.push_back(p.reply_fd);
    }
  }
  Proc fresh;
  std::string old;
  {
    py::gil_scoped_acquire gil;
    try {
      py::tuple t = respawn_(i, fds);
      fresh.pid = t[0].cast<int>();
      fresh.request_fd = t[1].cast<int>();
      fresh.reply_fd = t[2].cast<int>();
      const int staging_fd = t[3].cast<int>();
      fresh.staging_bytes = t[4].cast<size_t>();
      if (!t[5].is_none()) old = py::str(t[5]).cast<std::string>();
      void* m = ::mmap(nullptr, fresh.staging_bytes, PROT_READ, MAP_SHARED, staging_fd, 0);
      ::close(staging_fd);
      if (m != MAP_FAILED) {
        fresh.staging = static_cast<uint8_t*>(m);
        fresh.alive = true;
      }
    } catch (py::error_already_set& e) {
      old = absl::StrCat("cannot start a worker process: ", e.what());
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (size_t(i) >= procs_.size()) {  // stopped meanwhile: the new process is not wanted
    if (fresh.alive) ::kill(fresh.pid, SIGKILL);
    CloseProc(fresh);
    idle_.notify_all();
    return old;
  }
  Proc& p = procs_[size_t(i)];
  p = fresh;
  if (!p.alive) CloseProc(p);
  idle_.notify_all();
  return old;
}

int PyTransform::AcquireProc() const {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    bool any_alive = false;
    for (size_t i = 0; i < procs_.size(); ++i) {
      if (!procs_[i].alive) continue;
      any_alive = true;
      if (!procs_[i].busy) {
        procs_[i].busy = true;
        return int(i);
      }
    }
    if (!any_alive || Stopped()) return -1;
    idle_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

int PyTransform::AcquireProc(int only) const {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    if (size_t(only) >= procs_.size() || Stopped()) return -1;
    if (!procs_[size_t(only)].alive && !procs_[size_t(only)].respawning) return -1;
    if (procs_[size_t(only)].alive && !procs_[size_t(only)].busy) {
      procs_[size_t(only)].busy = true;
      return only;
    }
    idle_.wait_for(lock, std::chrono::milliseconds(200));
  }
}

void PyTransform::ReleaseProc(int i) const {
  std::lock_guard<std::mutex> lock(mu_);
  procs_[size_t(i)].busy = false;
  idle_.notify_all();  // a worker waiting for a process, or StopProcesses for this one
}

absl::Status PyTransform::Exchange(const std::vector<int64_t>& request, const std::string& what,
                                   Reply& r, int only, bool chunk) const {
  std::string died;  // the first death, if the retry dies too
  for (int attempt = 0; attempt < 2; ++attempt) {
    const int i = only >= 0 ? AcquireProc(only) : AcquireProc();
    if (i < 0) {
      if (Stopped()) return absl::CancelledError("the loader is closed");
      return absl::UnknownError(absl::StrCat(
          "feedline: ", only >= 0 ? absl::StrCat("worker process ", only, " is not")
                                  : std::string("no worker process is"),
          " running (", what, ")"));
    }
    Proc p;
    {
      std::lock_guard<std::mutex> lock(mu_);
      p = procs_[size_t(i)];
    }
    const double timeout = timeout_s_.load();
    int64_t reply[4] = {0, 0, 0, 0};
    const int64_t t0 = NowNs();
    Io io = WriteAll(p.request_fd, request.data(), request.size() * 8) ? Io::kOk : Io::kEof;
    if (io == Io::kOk) io = ReadAll(p.reply_fd, reply, sizeof reply, timeout, closed_, stopping_);
    r.inline_payload.clear();
    // Every field of the reply is checked before it is used: a status and an "inline" flag of 0
    // or 1, a size within what the staging area holds (or, inline, within kMaxInlineReply, and
    // only what this process can allocate). Anything else is a malformed reply: the error of
    // this request, and the worker is replaced (its pipe may hold the rest of the lie).
    std::string malformed;
    if (io == Io::kOk) {
      if ((reply[0] != 0 && reply[0] != 1 && !(chunk && reply[0] == 2 && reply[1] == 0)) ||
          (reply[1] != 0 && reply[1] != 1)) {
        malformed = absl::StrCat("status ", reply[0], ", inline ", reply[1]);
      } else if (reply[2] < 0 || (reply[1] == 0 && uint64_t(reply[2]) > p.staging_bytes) ||
                 (reply[1] != 0 && reply[2] > kMaxInlineReply)) {
        malformed = absl::StrCat("a payload of ", reply[2], " bytes (staging area ",
                                 p.staging_bytes, ", inline at most ", kMaxInlineReply, ")");
      } else if (reply[1] != 0) {
        try {
          r.inline_payload.resize(size_t(reply[2]));
        } catch (const std::bad_alloc&) {
          malformed = absl::StrCat("a payload of ", reply[2], " bytes, which cannot be allocated");
        }
        if (malformed.empty()) {
          io = ReadAll(p.reply_fd, r.inline_payload.data(), r.inline_payload.size(), timeout,
                       closed_, stopping_);
        }
      }
    }
    if (!malformed.empty()) return ReplaceMalformed(i, p.pid, malformed, what);
    if (io == Io::kClosed) {
      ReleaseProc(i);
      return absl::CancelledError("the loader is closed");
    }
    if (io == Io::kTimeout) {
      timeouts_.fetch_add(1);
      ::kill(p.pid, SIGKILL);
      Respawn(i);
      return absl::UnknownError(absl::StrCat("DataLoader timed out after ", timeout, " seconds (",
                                             what, ", worker process ", p.pid,
                                             ")\n{\"type\": \"RuntimeError\"}"));
    }
    if (io != Io::kOk) {  // the process died (or its pipe broke): replace it, retry once
      deaths_.fetch_add(1);
      const std::string code = Respawn(i);
      // Worded as torch's ("DataLoader worker (pid N) is killed by signal: ..."), then what.
      const std::string text =
          absl::StrCat("DataLoader worker (pid ", p.pid, ") ",
                       code.empty() ? "exited unexpectedly." : code, " (loading ", what, ")");
      if (attempt == 0) {
        died = text;
        retries_.fetch_add(1);
        continue;
      }
      return absl::UnknownError(absl::StrCat(
          text, "; feedline retried it on a new worker, which died too (first: ", died, ")",
          "\n{\"type\": \"RuntimeError\"}"));
    }
    exchanges_.fetch_add(1, std::memory_order_relaxed);
    r.proc = i;
    r.status = reply[0];
    // A process's word, so bounded (it is only a cost estimate): at most its wall time x cores.
    r.cpu_ns = std::clamp<int64_t>(reply[3], 0,
                                   (NowNs() - t0) * int64_t(std::thread::hardware_concurrency()));
    r.data = reply[1] != 0 ? r.inline_payload.data() : p.staging;
    r.size = size_t(reply[2]);
    return absl::OkStatus();
  }
  return absl::InternalError("unreachable");
}

absl::Status PyTransform::ApplyProcess(int64_t position, int64_t epoch, ThreadWorker* state,
                                       SampleWriter& out) const {
  KeySet set;
  int proc = -1;  // the batch's worker process
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A head start's positions (the engine's next epoch, started ahead) are of the keys set
    // ahead; every other, of the epoch's.
    set = ahead_started_ && epoch == ahead_epoch_ ? ahead_ : keys_;
    if (!procs_.empty() && position >= 0) {
      proc = int((set.first_batch + position / set.per_batch) % int64_t(procs_.size()));
    }
  }
  const auto& keys = set.keys;
  const auto& offsets = set.offsets;
  const int64_t seed = set.seed, first_index = set.first_index, per_batch = set.per_batch;
  const int64_t chunk = set.chunk, generation = set.generation;
  if (!keys || position < 0 || position + 1 >= int64_t(offsets->size())) {
    return Failed(position, absl::StrCat("feedline: no keys for position ", position), generation);
  }
  const int64_t b = (*offsets)[size_t(position)], e = (*offsets)[size_t(position) + 1];
  const std::string what =
      e - b == 1 ? absl::StrCat("dataset[", (*keys)[size_t(b)], "]")
                 : absl::StrCat("the batch of dataset[",
                                absl::StrJoin(keys->begin() + b, keys->begin() + e, ", "), "]");
  // A sample of this thread's last chunk: no exchange.
  if (state != nullptr && state->chunk_generation == generation && position > state->chunk_first &&
      position - state->chunk_first < int64_t(state->chunk_entries.size())) {
    return WriteChunkSample(*state, position, what, out);
  }
  // Small samples in place: this position and the next ones of its batch, in one exchange.
  int64_t count = 1;
  if (!batch_mode_ && chunk > 1 && state != nullptr) {
    count = std::min({chunk, (position / per_batch + 1) * per_batch - position,
                      int64_t(offsets->size()) - 1 - position});
    // One key per position in place; anything else is asked for alone.
    if ((*offsets)[size_t(position + count)] - b != count) count = 1;
  }
  const int64_t last = (*offsets)[size_t(position + count)];
  std::vector<int64_t> request = {1, position, last - b, seed, first_index + b};
  request.insert(request.end(), keys->begin() + b, keys->begin() + last);
  Reply r;
  absl::Status st = Exchange(request, what, r, proc, /*chunk=*/count > 1);
  if (absl::IsCancelled(st)) return st;
  ReportOffThreadCpu(r.cpu_ns);  // the samples' cost is the process's CPU, not this wait
  if (!st.ok()) return Failed(position, std::string(st.message()), generation);
  if (r.status == 2) {  // a chunk: its table checked, copied, and the process is free again
    st = ReadChunkTable(r.data, r.size, count, &state->chunk_entries);
    if (!st.ok()) {
      state->chunk_entries.clear();
      int pid = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        pid = procs_[size_t(r.proc)].pid;
      }
      return Failed(position,
                    std::string(ReplaceMalformed(r.proc, pid, st.message(), what).message()),
                    generation);
    }
    state->chunk_bytes.assign(r.data, r.data + r.size);
    state->chunk_first = position;
    state->chunk_generation = generation;
    ReleaseProc(r.proc);
    return WriteChunkSample(*state, position, what, out);
  }
  if (r.status != 0) {
    st = Failed(position, std::string(reinterpret_cast<const char*>(r.data), r.size), generation);
  } else if (batch_mode_) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      results_.emplace(std::make_pair(generation, position),
                       std::string(reinterpret_cast<const char*>(r.data), r.size));
    }
    *out.Fixed<int64_t>(0) = position;
  } else {
    st = WriteFields(r.data, r.size, out);
    if (!st.ok()) st = Failed(position, absl::StrCat(what, ": ", st.message()), generation);
  }
  ReleaseProc(r.proc);  // only now: the staging area has been copied
  return st;
}

absl::Status PyTransform::ReplaceMalformed(int i, int pid, absl::string_view why,
                                           const std::string& what) const {
  malformed_.fetch_add(1);
  ::kill(pid, SIGKILL);
  Respawn(i);
  return absl::UnknownError(absl::StrCat("feedline: worker process ", pid,
                                         " sent a malformed reply (", why, ") for ", what,
                                         "; it was replaced\n{\"type\": \"RuntimeError\"}"));
}

absl::Status PyTransform::WriteChunkSample(const ThreadWorker& state, int64_t position,
                                           const std::string& what, SampleWriter& out) const {
  const ChunkEntry& c = state.chunk_entries[size_t(position - state.chunk_first)];
  const uint8_t* data = state.chunk_bytes.data() + c.offset;
  if (c.status != 0) {
    return Failed(position, std::string(reinterpret_cast<const char*>(data), c.size),
                  state.chunk_generation);
  }
  absl::Status st = WriteFields(data, c.size, out);
  return st.ok() ? st
                 : Failed(position, absl::StrCat(what, ": ", st.message()), state.chunk_generation);
}

void PyTransform::AdoptProcesses(PyTransform& from, const std::string& config) {
  std::vector<Proc> procs;
  // No request of `from`'s in flight: a worker thread of a cancelled epoch may still be inside
  // one. It is let finish (not cut short as StopProcesses does): a request given up would leave
  // its reply in the pipe, read by the next request as its own. And no respawn in progress (it
  // writes procs_[i] after dropping mu_): spawn_mu_ is held for the swap, but not while
  // waiting, since a request whose process died respawns it (under spawn_mu_) before it is idle.
  const auto idle = [&] {
    return std::none_of(from.procs_.begin(), from.procs_.end(),
                        [](const Proc& p) { return p.busy; });
  };
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(from.mu_);
      from.idle_.wait(lock, idle);
    }
    std::lock_guard<std::mutex> spawn(from.spawn_mu_);
    std::lock_guard<std::mutex> lock(from.mu_);
    if (!idle()) continue;  // a request began meanwhile
    procs.swap(from.procs_);
    from.idle_.notify_all();
    break;
  }
  {
    py::gil_scoped_acquire gil;
    respawn_ = from.respawn_;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (Proc& p : procs_) CloseProc(p);
    procs_ = std::move(procs);
  }
  // Every process takes the new configuration: [op=3, nbytes, words, 0, 0, payload words].
  const int64_t words = int64_t((config.size() + 7) / 8);
  std::vector<int64_t> request = {3, int64_t(config.size()), words, 0, 0};
  request.resize(request.size() + size_t(words), 0);
  std::memcpy(request.data() + 5, config.data(), config.size());
  for (int i = 0; i < processes(); ++i) {
    Reply r;
    absl::Status st = Exchange(request, "the loader's new batch layout", r, i);
    if (st.ok()) {
      const bool failed = r.status != 0;
      ReleaseProc(r.proc);
      if (failed) Respawn(i);  // made with the new configuration (Python's respawn has it)
    } else if (!absl::IsCancelled(st)) {
      Respawn(i);
    }
  }
}

PyTransform::KeySet PyTransform::MakeKeySet(std::vector<int64_t> keys, std::vector<int64_t> offsets,
                                            int64_t seed, int64_t first_index, int64_t first_batch,
                                            int64_t positions_per_batch, int64_t chunk) {
  KeySet set;
  set.keys = std::make_shared<const std::vector<int64_t>>(std::move(keys));
  set.offsets = std::make_shared<const std::vector<int64_t>>(std::move(offsets));
  set.seed = seed;
  set.first_index = first_index;
  set.first_batch = std::max<int64_t>(0, first_batch);
  set.per_batch = std::max<int64_t>(1, positions_per_batch);
  set.chunk = std::max<int64_t>(1, chunk);
  return set;
}

void PyTransform::ClearAhead() {
  ahead_ = KeySet();
  ahead_epoch_ = -1;
  ahead_started_ = false;
}

void PyTransform::SetKeys(std::vector<int64_t> keys, std::vector<int64_t> offsets, int64_t seed,
                          int64_t first_index, int64_t first_batch, int64_t positions_per_batch,
                          int64_t chunk) {
  KeySet set = MakeKeySet(std::move(keys), std::move(offsets), seed, first_index, first_batch,
                          positions_per_batch, chunk);
  std::lock_guard<std::mutex> lock(mu_);
  set.generation = ++generation_;
  keys_ = std::move(set);
  ClearAhead();
  errors_.clear();
  results_.clear();
}

bool PyTransform::SetKeysAhead(int64_t epoch, std::vector<int64_t> keys,
                               std::vector<int64_t> offsets, int64_t seed,
                               int64_t positions_per_batch, int64_t chunk) {
  KeySet set = MakeKeySet(std::move(keys), std::move(offsets), seed, /*first_index=*/0,
                          /*first_batch=*/0, positions_per_batch, chunk);
  std::lock_guard<std::mutex> lock(mu_);
  if (ahead_started_) return false;
  set.generation = ++generation_;
  ahead_ = std::move(set);
  ahead_epoch_ = epoch;
  return true;
}

bool PyTransform::AdoptAhead() {
  std::lock_guard<std::mutex> lock(mu_);
  if (ahead_epoch_ < 0) return false;
  keys_ = std::move(ahead_);
  ClearAhead();
  for (auto it = errors_.begin(); it != errors_.end();) {  // the last epoch's are not asked for
    it = it->first.first == keys_.generation ? std::next(it) : errors_.erase(it);
  }
  for (auto it = results_.begin(); it != results_.end();) {
    it = it->first.first == keys_.generation ? std::next(it) : results_.erase(it);
  }
  return true;
}

void PyTransform::ForgetAhead() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearAhead();
}

bool PyTransform::MayStartEpoch(int64_t epoch) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (procs_.empty() || ahead_epoch_ != epoch) return false;
  ahead_started_ = true;
  return true;
}

std::string PyTransform::TakeError(int64_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = errors_.find({keys_.generation, position});
  if (it == errors_.end()) return "";
  std::string s = std::move(it->second);
  errors_.erase(it);
  return s;
}

std::string PyTransform::TakeResult(int64_t position) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = results_.find({keys_.generation, position});
  if (it == results_.end()) return "";
  std::string s = std::move(it->second);
  results_.erase(it);
  return s;
}

py::dict PyTransform::Stats() const {
  py::dict d;
  d["samples"] = samples_.load();
  d["gil_wait_s"] = double(gil_wait_ns_.load()) * 1e-9;
  d["call_s"] = double(call_ns_.load()) * 1e-9;
  d["off_cpu_s"] = double(off_cpu_ns_.load()) * 1e-9;
  d["worker_deaths"] = deaths_.load();
  d["retries"] = retries_.load();
  d["timeouts"] = timeouts_.load();
  d["malformed_replies"] = malformed_.load();
  d["exchanges"] = exchanges_.load();  // requests answered by worker processes
  d["processes"] = processes();
  return d;
}

}  // namespace feedline::python
