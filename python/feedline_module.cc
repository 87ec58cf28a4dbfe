// The `feedline._feedline` extension: the C++ loader for Python.
//
// Tensors leave through DLPack (`__dlpack__` / `__dlpack_device__`), zero-copy: the capsule
// owns a reference to the batch's slot, and the slot returns to the ring when the consumer's
// tensor dies. No LibTorch, no libtorch_python: any DLPack consumer works.
//
// The GIL is released around every call that may block (waiting for a batch, creating a
// loader, destroying an epoch, which joins its threads). The capsule deleter touches no Python
// object, so it may run on any thread, with or without the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "feedline/feedline.h"
#include "feedline/text.h"
#include "py_dataset.h"
#include "py_options.h"

namespace py = pybind11;

namespace {

// The Python exception types (set at module import).
py::object g_data_error;
py::object g_device_error;

// --- DLPack (the stable C ABI of https://dmlc.github.io/dlpack, version 0.8) -----------------
enum DLDeviceType : int32_t { kDLCPU = 1, kDLCUDA = 2, kDLCUDAHost = 3 };
struct DLDevice {
  int32_t device_type;
  int32_t device_id;
};
enum DLDataTypeCode : uint8_t { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 };
struct DLDataType {
  uint8_t code;
  uint8_t bits;
  uint16_t lanes;
};
struct DLTensor {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
};
struct DLManagedTensor {
  DLTensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(DLManagedTensor* self);
};

// Owns what a DLManagedTensor points into: a reference to the batch, and the shape.
struct DLPackOwner {
  std::shared_ptr<const void> keep_alive;
  std::vector<int64_t> shape;    // any rank: generic schemas have fields of any shape
  std::vector<int64_t> strides;  // in elements, row-major
  DLManagedTensor managed;
};

void DeleteOwner(DLManagedTensor* self) { delete static_cast<DLPackOwner*>(self->manager_ctx); }

void CapsuleDestructor(PyObject* capsule) {
  // A consumer renames the capsule to "used_dltensor" and takes over the deleter; only an
  // unconsumed capsule is ours to free.
  // PyCapsule_IsValid sets no error, so nothing is cleared here: a destructor that ran while an
  // exception was propagating must leave that exception alone.
  if (PyCapsule_IsValid(capsule, "dltensor")) {
    auto* managed = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
    if (managed != nullptr && managed->deleter != nullptr) managed->deleter(managed);
  }
}

// One array of a batch (images, labels or indices), exported through DLPack.
class ArrayView {
 public:
  ArrayView(std::shared_ptr<const feedline::Batch> batch, void* data, DLDataType dtype,
            std::vector<int64_t> shape, int device)
      : batch_(std::move(batch)),
        data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        device_(device) {}

  // `stream` follows the DLPack protocol: None, or the consumer's stream as an int (1: CUDA's
  // legacy default stream, 2: per-thread default, else a cudaStream_t; -1: no synchronisation).
  py::object DLPack(py::object stream) const {
    int64_t stream_value = 0;
    if (!stream.is_none()) {
      if (!py::isinstance<py::int_>(stream)) throw py::type_error("stream: must be None or an int");
      stream_value = stream.cast<int64_t>();
    }
    if (device_ >= 0) {
      // The consumer's stream waits for the copy and conversion (an event, no host wait), and
      // the batch's device buffer is reused only after the work queued there at release.
      // -1: no wait (the consumer synchronises itself; reuse after a device-wide sync).
      void* s =
          stream_value == -1 ? feedline::kNoSyncStream : reinterpret_cast<void*>(stream_value);
      absl::Status st;
      {
        py::gil_scoped_release release;
        st = batch_->set_consumer_stream(s);
      }
      if (!st.ok()) {
        PyErr_SetString(g_device_error.ptr(),
                        absl::StrCat("feedline: cannot hand the batch to stream ", stream_value,
                                     ": ", st.message())
                            .c_str());
        throw py::error_already_set();
      }
    }
    auto* owner = new DLPackOwner();
    owner->keep_alive = batch_;
    owner->shape = shape_;
    DLTensor& t = owner->managed.dl_tensor;
    t.data = data_;
    t.device = device_ >= 0 ? DLDevice{kDLCUDA, device_} : DLDevice{kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape_.size());
    t.dtype = dtype_;
    t.shape = owner->shape.data();
    // Explicit row-major strides (in elements): DLPack allows null for compact tensors, but
    // newer consumers ask exporters to give them.
    owner->strides.assign(shape_.size(), 1);
    for (size_t d = shape_.size(); d-- > 1;) {
      owner->strides[d - 1] = owner->strides[d] * std::max<int64_t>(shape_[d], 1);
    }
    t.strides = owner->strides.empty() ? nullptr : owner->strides.data();
    t.byte_offset = 0;
    owner->managed.manager_ctx = owner;
    owner->managed.deleter = &DeleteOwner;
    PyObject* capsule = PyCapsule_New(&owner->managed, "dltensor", &CapsuleDestructor);
    if (capsule == nullptr) {
      delete owner;
      throw py::error_already_set();
    }
    return py::reinterpret_steal<py::object>(capsule);
  }
  py::tuple DLPackDevice() const {
    return device_ >= 0 ? py::make_tuple(int(kDLCUDA), device_) : py::make_tuple(int(kDLCPU), 0);
  }
  std::vector<int64_t> shape() const { return shape_; }

 private:
  std::shared_ptr<const feedline::Batch> batch_;
  void* data_;
  DLDataType dtype_;
  std::vector<int64_t> shape_;
  int device_;
};

DLDataType DLPackDType(feedline::DType t) {
  switch (t) {
    case feedline::DType::kFloat32:
      return DLDataType{kDLFloat, 32, 1};
    case feedline::DType::kFloat16:
      return DLDataType{kDLFloat, 16, 1};
    case feedline::DType::kBFloat16:
      return DLDataType{kDLBfloat, 16, 1};
    case feedline::DType::kInt32:
      return DLDataType{kDLInt, 32, 1};
    case feedline::DType::kInt64:
      return DLDataType{kDLInt, 64, 1};
    case feedline::DType::kFloat64:
      return DLDataType{kDLFloat, 64, 1};
    case feedline::DType::kInt8:
      return DLDataType{kDLInt, 8, 1};
    case feedline::DType::kInt16:
      return DLDataType{kDLInt, 16, 1};
    case feedline::DType::kUint8:
    case feedline::DType::kBytes:
    case feedline::DType::kBool:  // torch 1.13 takes no DLPack bool: uint8, viewed as bool
      break;
  }
  return DLDataType{kDLUInt, 8, 1};
}

// Destroying an epoch joins its threads: never with the GIL held.
struct ReleaseGilDeleter {
  template <typename E>
  void operator()(E* e) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      delete e;
    } else {
      delete e;
    }
  }
};
using EpochHolder = std::unique_ptr<feedline::Epoch, ReleaseGilDeleter>;
using PackedEpochHolder = std::unique_ptr<feedline::text::PackedEpoch, ReleaseGilDeleter>;
// A loader's destructor may wait for its threads, which may wait for the GIL (Python data sets).
using LoaderHolder = std::unique_ptr<feedline::Loader, ReleaseGilDeleter>;

[[noreturn]] void ThrowStatus(const absl::Status& s, bool sample_error) {
  const std::string msg(s.message());
  if (feedline::IsDeviceError(s)) {  // a GPU failure is never a bad sample
    PyErr_SetString(g_device_error.ptr(), msg.c_str());
    throw py::error_already_set();
  }
  if (sample_error) {
    PyErr_SetString(g_data_error.ptr(), msg.c_str());
    throw py::error_already_set();
  }
  switch (s.code()) {
    case absl::StatusCode::kDataLoss:  // a damaged file (a shard's index, ...): data, not args
      PyErr_SetString(g_data_error.ptr(), msg.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(msg);
    case absl::StatusCode::kNotFound:
      PyErr_SetString(PyExc_FileNotFoundError, msg.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kFailedPrecondition:  // the machine cannot do it (no GPU/driver)
      throw std::runtime_error(msg);
    case absl::StatusCode::kPermissionDenied:
      PyErr_SetString(PyExc_PermissionError, msg.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kUnavailable:  // storage unreachable: refused, reset, TLS, 5xx
      PyErr_SetString(PyExc_ConnectionError, msg.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(msg);
  }
}

template <typename E>
E ParseEnum(const std::string& value, const char* option,
            std::initializer_list<std::pair<const char*, E>> choices) {
  std::string names;
  for (auto& [name, e] : choices) {
    if (value == name) return e;
    absl::StrAppend(&names, names.empty() ? "" : ", ", "'", name, "'");
  }
  throw py::value_error(absl::StrCat(option, ": expected one of ", names, ", got '", value, "'"));
}

feedline::DType DTypeOf(const std::string& name) {
  for (const auto& [n, t] : feedline::EnumNames<feedline::DType>::kValues) {
    if (name == n) return t;
  }
  throw py::value_error(absl::StrCat("no feedline dtype '", name, "'"));
}

py::dict StatsToDict(const feedline::Stats& s) {
  py::dict d;
  d["elapsed_s"] = s.elapsed_s;
  d["images"] = s.images;
  d["batches"] = s.batches;
  d["images_per_s"] = s.images_per_s;
  d["consumer_wait_s"] = s.consumer_wait_s;
  d["consumer_wait_fraction"] = s.consumer_wait_fraction;
  d["epoch_start_wait_s"] = s.epoch_start_wait_s;
  d["consumer_cpu_s"] = s.consumer_cpu_s;
  d["consumer_run_delay_s"] = s.consumer_run_delay_s;
  d["worker_nice"] = s.worker_nice;
  py::dict stages;
  for (const feedline::StageStats& st : s.stages) {
    py::dict x;
    x["busy_s"] = st.busy_s;
    x["wait_s"] = st.wait_s;
    x["items"] = st.items;
    x["threads"] = st.threads;
    if (st.occupancy >= 0) x["occupancy"] = st.occupancy;
    stages[py::str(st.name)] = x;
  }
  d["stages"] = stages;
  d["workers"] = s.workers;
  d["prefetch"] = s.prefetch;
  d["io_depth"] = s.io_depth;
  d["chunk"] = s.chunk;
  d["bytes_in_use"] = s.bytes_in_use;
  d["memory_budget"] = s.memory_budget;
  d["slots_allocated"] = s.slots_allocated;
  d["slots_created"] = s.slots_created;
  d["bottleneck"] = s.bottleneck;
  d["bottleneck_reason"] = s.bottleneck_reason;
  d["auto"] = py::dict(py::arg("workers") = s.auto_workers, py::arg("io_depth") = s.auto_io_depth,
                       py::arg("prefetch") = s.auto_prefetch);
  d["demand_images_per_s"] = s.demand_images_per_s;
  d["decode_ms_per_image"] = s.decode_ms_per_image;
  d["read_ms"] = s.read_ms;
  py::list tuning;
  for (const feedline::TuningEvent& t : s.tuning) {
    tuning.append(py::dict(py::arg("time_s") = t.time_s, py::arg("workers") = t.workers,
                           py::arg("io_depth") = t.io_depth, py::arg("prefetch") = t.prefetch,
                           py::arg("images_per_s") = t.images_per_s, py::arg("reason") = t.reason));
  }
  d["tuning"] = tuning;
  py::list timeline;
  for (const feedline::TimelinePoint& t : s.timeline) {
    timeline.append(py::dict(py::arg("time_s") = t.time_s, py::arg("images_per_s") = t.images_per_s,
                             py::arg("consumer_wait_fraction") = t.consumer_wait_fraction,
                             py::arg("workers") = t.workers, py::arg("io_depth") = t.io_depth,
                             py::arg("prefetch") = t.prefetch,
                             py::arg("bytes_in_use") = t.bytes_in_use));
  }
  d["timeline"] = timeline;
  d["cache"] = py::dict(py::arg("kind") = s.cache, py::arg("hits") = s.cache_hits,
                        py::arg("misses") = s.cache_misses, py::arg("bytes") = s.cache_bytes,
                        py::arg("budget") = s.cache_budget);
  d["error_count"] = s.error_count;
  if (s.remote.remote) {
    py::dict r;
    r["requests"] = s.remote.requests;
    r["retries"] = s.remote.retries;
    r["failures"] = s.remote.failures;
    r["bytes"] = s.remote.bytes;
    r["in_flight"] = s.remote.in_flight;
    r["request_ms"] = s.remote.request_ms;
    d["remote"] = r;
  }
  py::list errors;
  for (const feedline::SampleError& e : s.errors) {
    py::dict x;
    x["path"] = e.path;
    x["cause"] = e.cause;
    x["sample"] = e.sample;
    x["epoch"] = e.epoch;
    errors.append(x);
  }
  d["errors"] = errors;
  return d;
}

}  // namespace

// The image built-in's data set is a FileDataset (classes, samples).
const feedline::FileList& FilesOf(const feedline::Loader& l) {
  static const feedline::FileList* none = new feedline::FileList();
  const auto* files = dynamic_cast<const feedline::FileDataset*>(&l.dataset());
  return files != nullptr ? files->files() : *none;
}

// The epoch's next batch, waiting with the GIL released (and Ctrl-C honoured); StopIteration at
// the end, the sample's error (DataError, DeviceError, ...) when it failed. `timeout_s` > 0:
// RuntimeError when no batch came within it, as torch's DataLoader(timeout=) raises (the batch
// stays queued: a later call may still get it).
template <typename E>  // feedline::Epoch, feedline::text::PackedEpoch
feedline::Batch NextBatch(E& e, double timeout_s = 0) {
  absl::StatusOr<feedline::Batch> batch;
  bool timed_out = false;
  {
    py::gil_scoped_release release;
    const auto start = std::chrono::steady_clock::now();
    batch = e.Next(
        [&] {
          if (timeout_s > 0 &&
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >=
                  timeout_s) {
            timed_out = true;
            return absl::DeadlineExceededError("timed out");
          }
          py::gil_scoped_acquire acquire;
          if (PyErr_CheckSignals() != 0) return absl::CancelledError("interrupted");
          return absl::OkStatus();
        },
        absl::Milliseconds(timeout_s > 0 ? std::clamp(timeout_s * 1e3 / 10, 1.0, 100.0) : 100.0));
  }
  if (!batch.ok()) {
    if (PyErr_Occurred()) throw py::error_already_set();
    if (timed_out) {
      PyErr_SetString(PyExc_RuntimeError,
                      absl::StrCat("DataLoader timed out after ", timeout_s,
                                   " seconds (no batch from the worker threads; a thread cannot be "
                                   "stopped: its sample goes on in the background)")
                          .c_str());
      throw py::error_already_set();
    }
    if (absl::IsOutOfRange(batch.status()) || absl::IsCancelled(batch.status())) {
      throw py::stop_iteration();
    }
    ThrowStatus(batch.status(), /*sample_error=*/true);
  }
  return *std::move(batch);
}

// Every field of a batch by name (any schema): dense fields as [B, ...] views; a padded
// variable field also gives "<name>_lengths"; a ragged one its values and "<name>_offsets".
py::dict FieldsOf(const feedline::Batch& b) {
  auto keep = std::make_shared<const feedline::Batch>(b);
  py::dict out;
  const int64_t n = b.size();
  for (int f = 0; f < b.num_fields(); ++f) {
    const feedline::TensorView v = b.field(f);
    const std::string name = b.schema().field(f).name();
    out[py::str(name)] = ArrayView(keep, v.data, DLPackDType(v.dtype), v.shape, v.device);
    if (v.ragged()) {
      out[py::str(name + "_offsets")] =
          ArrayView(keep, const_cast<int64_t*>(v.offsets), DLDataType{kDLInt, 64, 1}, {n + 1}, -1);
    } else if (v.lengths != nullptr) {
      out[py::str(name + "_lengths")] =
          ArrayView(keep, const_cast<int64_t*>(v.lengths), DLDataType{kDLInt, 64, 1}, {n}, -1);
    }
  }
  return out;
}

// The engine's options as the generic loaders (token_loader, text_loader, ...) take them: their
// declared names, types and defaults (python/py_options.h).
feedline::LoaderOptions EngineOptions(const py::kwargs& kwargs) {
  feedline::LoaderOptions o;
  feedline::python::SetOptions(kwargs, {feedline::OptionGroup::kEngine}, &o);
  return o;
}

feedline::text::PackOptions PackOptionsOf(const std::string& pack, int64_t seq_len,
                                          int64_t window_rows, bool split_long,
                                          bool mask_boundaries, int64_t batch_size,
                                          bool drop_last) {
  feedline::text::PackOptions p;
  p.mode = ParseEnum<feedline::text::PackMode>(pack, "pack",
                                               {{"concat", feedline::text::PackMode::kConcat},
                                                {"bestfit", feedline::text::PackMode::kBestFit},
                                                {"bucket", feedline::text::PackMode::kBucket}});
  p.seq_len = seq_len;
  p.batch_size = batch_size;
  p.window_rows = window_rows;
  p.split_long = split_long;
  p.mask_boundaries = mask_boundaries;
  p.drop_last = drop_last;
  return p;
}

const char* PackModeName(int mode) {
  switch (feedline::text::PackMode(mode)) {
    case feedline::text::PackMode::kConcat:
      return "concat";
    case feedline::text::PackMode::kBestFit:
      return "bestfit";
    case feedline::text::PackMode::kBucket:
      return "bucket";
  }
  return "?";
}

py::dict StateToDict(const feedline::Loader::State& s) {
  py::dict d;
  d["epoch"] = s.epoch;
  d["batches_done"] = s.batches_done;
  d["seed"] = s.seed;
  d["rank"] = s.rank;
  d["world_size"] = s.world_size;
  d["batch_size"] = s.batch_size;
  d["shuffle"] = s.shuffle;
  d["drop_last"] = s.drop_last;
  d["dataset_size"] = s.dataset_size;
  d["dataset_fingerprint"] = absl::StrCat(absl::Hex(s.dataset_fingerprint));
  d["version"] = 1;
  return d;
}

feedline::Loader::State DictToState(const py::dict& d) {
  const char* keys[] = {"epoch",        "batches_done",       "seed",    "rank",
                        "world_size",   "batch_size",         "shuffle", "drop_last",
                        "dataset_size", "dataset_fingerprint"};
  for (const char* k : keys) {
    if (!d.contains(k)) throw py::value_error(absl::StrCat("state_dict: missing key '", k, "'"));
  }
  feedline::Loader::State s;
  // Each value cast on its own, so that a wrong one is named (bool is not an int here).
  auto get = [&d](const char* key, auto* out) {
    using T = std::remove_pointer_t<decltype(out)>;
    const py::handle v = d[key];
    const bool is_bool = py::isinstance<py::bool_>(v);
    if constexpr (std::is_same_v<T, bool>) {
      if (!is_bool) throw py::type_error(absl::StrCat("state_dict: '", key, "' must be a bool"));
      *out = v.cast<bool>();
    } else {
      if (is_bool || !py::isinstance<py::int_>(v)) {
        throw py::type_error(absl::StrCat("state_dict: '", key, "' must be an int"));
      }
      try {
        *out = v.cast<T>();
      } catch (const py::cast_error&) {
        throw py::value_error(absl::StrCat("state_dict: '", key, "' is out of range (",
                                           std::string(py::str(v)), ")"));
      }
    }
  };
  get("epoch", &s.epoch);
  get("batches_done", &s.batches_done);
  get("seed", &s.seed);
  get("rank", &s.rank);
  get("world_size", &s.world_size);
  get("batch_size", &s.batch_size);
  get("shuffle", &s.shuffle);
  get("drop_last", &s.drop_last);
  get("dataset_size", &s.dataset_size);
  const py::handle fp = d["dataset_fingerprint"];
  if (!py::isinstance<py::str>(fp) ||
      !absl::SimpleHexAtoi(fp.cast<std::string>(), &s.dataset_fingerprint)) {
    throw py::type_error("state_dict: 'dataset_fingerprint' must be a hex string");
  }
  return s;
}

// A SentencePiece model by path or URL (a URL's local copy is loaded; errors name the URL).
absl::StatusOr<std::shared_ptr<const feedline::text::Tokenizer>> LoadTokenizer(
    const std::string& model, bool word_cache) {
  absl::StatusOr<std::string> local = feedline::LocalCopy(model);
  if (!local.ok()) return local.status();
  feedline::text::SentencePieceOptions options;
  options.word_cache = word_cache;
  auto tokenizer = feedline::text::LoadSentencePiece(*local, options);
  if (!tokenizer.ok() && *local != model) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrReplaceAll(tokenizer.status().message(), {{*local, model}}));
  }
  return tokenizer;
}

// A loaded tokenizer, shared by the loaders made with it (Python's view of it: its counters).
struct TokenizerHandle {
  std::shared_ptr<const feedline::text::Tokenizer> tokenizer;
};

// Documents of a text / JSON Lines file (a path or URL) or WebDataset shards, tokenized by a
// SentencePiece model in the workers: padded int64 ids, or ragged int32 ones for the packer.
// The text built-in's tokenize options, as the text loaders take them.
feedline::text::TokenizeOptions TokenizeOptionsOf(
    const std::string& field, std::shared_ptr<const feedline::text::Tokenizer> tokenizer,
    int64_t max_length, bool add_bos, bool add_eos,
    std::shared_ptr<feedline::text::CutCounter> cut) {
  feedline::text::TokenizeOptions t;
  t.tokenizer = std::move(tokenizer);
  t.max_length = max_length;
  t.add_bos = add_bos;
  t.add_eos = add_eos;
  t.field = field;
  t.cut = std::move(cut);
  return t;
}

PYBIND11_MODULE(_feedline, m) {
  m.doc() = "feedline: a high-throughput image loader (C++ core)";
  g_data_error = py::reinterpret_steal<py::object>(
      PyErr_NewExceptionWithDoc("feedline.DataError",
                                "A sample could not be read or decoded (the message names the "
                                "file and the cause).",
                                PyExc_RuntimeError, nullptr));
  m.attr("DataError") = g_data_error;
  g_device_error = py::reinterpret_steal<py::object>(PyErr_NewExceptionWithDoc(
      "feedline.DeviceError",
      "The GPU path failed (no device or driver, out of device memory, a CUDA error): not a "
      "sample's fault, so never a DataError.",
      PyExc_RuntimeError, nullptr));
  m.attr("DeviceError") = g_device_error;

  // The text built-in's token windows (feedline/text.h) on the generic engine.
  m.def(
      "token_loader",
      [](const std::string& path, const std::string& dtype, int64_t seq_len, int64_t vocab_size,
         const py::kwargs& engine) {
        feedline::text::TokenFileOptions t;
        t.path = path;
        t.dtype = ParseEnum<feedline::text::TokenDType>(
            dtype, "dtype",
            {{"uint16", feedline::text::TokenDType::kUint16},
             {"uint32", feedline::text::TokenDType::kUint32}});
        t.seq_len = seq_len;
        t.vocab_size = vocab_size;
        feedline::LoaderOptions o = EngineOptions(engine);
        absl::StatusOr<std::unique_ptr<feedline::Loader>> loader;
        {
          py::gil_scoped_release release;
          absl::StatusOr<feedline::text::TokenWindows> w =
              [&]() -> absl::StatusOr<feedline::text::TokenWindows> {
            absl::StatusOr<std::string> local = feedline::LocalCopy(path);
            if (!local.ok()) return local.status();
            t.path = *local;
            t.name = path;
            return feedline::text::OpenTokenWindows(t);
          }();
          if (!w.ok()) {
            loader = w.status();
          } else {
            loader = feedline::Loader::Create(w->dataset, w->transform, std::move(o));
          }
        }
        if (!loader.ok()) ThrowStatus(loader.status(), false);
        return LoaderHolder(loader->release());
      },
      py::arg("path"), py::arg("dtype"), py::arg("seq_len"), py::arg("vocab_size"));

  // Documents from text / JSON Lines files, tokenized in the workers (feedline/text.h).
  m.def(
      "text_loader",
      [](const std::string& path, const std::string& field, const TokenizerHandle& tokenizer,
         int64_t max_length, bool add_bos, bool add_eos, const py::kwargs& engine) {
        feedline::LoaderOptions o = EngineOptions(engine);
        absl::StatusOr<std::unique_ptr<feedline::Loader>> loader;
        // Documents cut to max_length: truncation is what padded batches ask for, but the
        // tokens past it are counted (stats()["truncation"]) and warned about, never dropped
        // unseen.
        auto cut = std::make_shared<feedline::text::CutCounter>();
        {
          py::gil_scoped_release release;
          loader = feedline::text::MakeTextLoader(
              path, TokenizeOptionsOf(field, tokenizer.tokenizer, max_length, add_bos, add_eos, cut),
              std::move(o));
        }
        if (!loader.ok()) ThrowStatus(loader.status(), false);
        return py::make_tuple(LoaderHolder(loader->release()), cut);
      },
      py::arg("path"), py::arg("field"), py::arg("tokenizer"), py::arg("max_length"),
      py::arg("add_bos"), py::arg("add_eos"));

  // Packed rows of tokenized documents (feedline/text.h PackedLoader): `batch_size` rows per
  // batch; the documents are tokenized `doc_batch` at a time in the workers.
  m.def(
      "packed_text_loader",
      [](const std::string& path, const std::string& field, const TokenizerHandle& tokenizer,
         int64_t max_length, bool add_bos, bool add_eos, const std::string& pack, int64_t seq_len,
         int64_t window_rows, bool split_long, bool mask_boundaries, int64_t doc_batch,
         int64_t batch_size, bool drop_last, const py::kwargs& engine) {
        // batch_size and drop_last are the packer's (rows); the documents come doc_batch at a
        // time, every one of them.
        feedline::text::PackOptions p = PackOptionsOf(pack, seq_len, window_rows, split_long,
                                                      mask_boundaries, batch_size, drop_last);
        feedline::LoaderOptions o = EngineOptions(engine).batch_size(doc_batch).drop_last(false);
        absl::StatusOr<std::unique_ptr<feedline::text::PackedLoader>> packed;
        {
          py::gil_scoped_release release;
          packed = feedline::text::MakePackedTextLoader(
              path,
              TokenizeOptionsOf(field, tokenizer.tokenizer, max_length, add_bos, add_eos, nullptr),
              p, std::move(o));
        }
        if (!packed.ok()) ThrowStatus(packed.status(), false);
        return std::move(*packed);
      },
      py::arg("path"), py::arg("field"), py::arg("tokenizer"), py::arg("max_length"),
      py::arg("add_bos"), py::arg("add_eos"), py::arg("pack"), py::arg("seq_len"),
      py::arg("window_rows"), py::arg("split_long"), py::arg("mask_boundaries"),
      py::arg("doc_batch"), py::arg("batch_size"), py::arg("drop_last"));

  // Packed rows of a token file's documents (its document index): as packed_text_loader.
  m.def(
      "packed_token_loader",
      [](const std::string& path, const std::string& dtype, const std::string& index,
         int64_t vocab_size, int64_t max_length, int64_t eos_id, const std::string& pack,
         int64_t seq_len, int64_t window_rows, bool split_long, bool mask_boundaries,
         int64_t doc_batch, int64_t batch_size, bool drop_last, int64_t pad_id,
         const py::kwargs& engine) {
        feedline::text::TokenDocumentOptions t;
        t.path = path;
        t.dtype = ParseEnum<feedline::text::TokenDType>(
            dtype, "dtype",
            {{"uint16", feedline::text::TokenDType::kUint16},
             {"uint32", feedline::text::TokenDType::kUint32}});
        t.index_path = index;
        t.vocab_size = vocab_size;
        t.max_length = max_length;
        t.eos_id = eos_id;
        t.cut = std::make_shared<feedline::text::CutCounter>();
        feedline::text::PackOptions p = PackOptionsOf(pack, seq_len, window_rows, split_long,
                                                      mask_boundaries, batch_size, drop_last);
        p.pad_id = pad_id;
        p.cut = t.cut;
        feedline::LoaderOptions o = EngineOptions(engine).batch_size(doc_batch).drop_last(false);
        absl::StatusOr<std::unique_ptr<feedline::text::PackedLoader>> packed;
        {
          py::gil_scoped_release release;
          packed = [&]() -> absl::StatusOr<std::unique_ptr<feedline::text::PackedLoader>> {
            absl::StatusOr<std::vector<std::string>> local =
                feedline::LocalCopies({t.path, t.index_path});
            if (!local.ok()) return local.status();
            t.name = t.path;
            t.index_name = t.index_path;
            t.path = (*local)[0];
            t.index_path = (*local)[1];
            auto docs = feedline::text::OpenTokenDocuments(t);
            if (!docs.ok()) return docs.status();
            auto loader = feedline::Loader::Create(docs->dataset, docs->transform, std::move(o));
            if (!loader.ok()) return loader.status();
            return feedline::text::PackedLoader::Create(*std::move(loader), p);
          }();
        }
        if (!packed.ok()) ThrowStatus(packed.status(), false);
        return std::move(*packed);
      },
      py::arg("path"), py::arg("dtype"), py::arg("index"), py::arg("vocab_size"),
      py::arg("max_length"), py::arg("eos_id"), py::arg("pack"), py::arg("seq_len"),
      py::arg("window_rows"), py::arg("split_long"), py::arg("mask_boundaries"),
      py::arg("doc_batch"), py::arg("batch_size"), py::arg("drop_last"), py::arg("pad_id"));

  // Python data sets (feedline.DataLoader): the transform and the engine around it.
  py::class_<feedline::python::PyTransform, std::shared_ptr<feedline::python::PyTransform>>(
      m, "PythonTransform")
      .def(py::init([](const py::list& fields, bool batch_mode, py::object fetch) {
             // fields: (name, dtype, shape, ragged[, pad_value]) with -n for a variable
             // dimension up to n (padded to the batch's longest with pad_value, or ragged)
             std::vector<feedline::Field> out;
             for (const py::handle& h : fields) {
               auto t = h.cast<py::tuple>();
               std::vector<feedline::Dim> shape;
               for (int64_t d : t[2].cast<std::vector<int64_t>>()) {
                 shape.push_back(d < 0 ? feedline::Dim::UpTo(-d) : feedline::Dim(d));
               }
               feedline::Field f(t[0].cast<std::string>(), DTypeOf(t[1].cast<std::string>()),
                                 std::move(shape));
               if (t[3].cast<bool>()) f.collate(feedline::Collate::kRagged);
               if (t.size() > 4) f.pad_value(t[4].cast<double>());
               out.push_back(std::move(f));
             }
             feedline::Schema schema(std::move(out));
             absl::Status st = schema.Validate();
             if (!st.ok()) ThrowStatus(st, false);
             return std::make_shared<feedline::python::PyTransform>(std::move(schema), batch_mode,
                                                                    std::move(fetch));
           }),
           py::arg("fields"), py::arg("batch_mode"), py::arg("fetch"))
      .def("use_processes", &feedline::python::PyTransform::UseProcesses)
      .def("stop_processes",
           [](feedline::python::PyTransform& t) {
             py::gil_scoped_release release;
             t.StopProcesses();
           })
      .def_property_readonly("processes", &feedline::python::PyTransform::processes)
      .def("set_keys", &feedline::python::PyTransform::SetKeys, py::arg("keys"),
           py::arg("offsets"), py::arg("seed") = 0, py::arg("first_index") = 0,
           py::arg("first_batch") = 0, py::arg("positions_per_batch") = 1)
      .def("set_timeout", &feedline::python::PyTransform::set_timeout_s)
      .def("adopt_processes",
           [](feedline::python::PyTransform& t, feedline::python::PyTransform& from,
              const py::bytes& config) {
             std::string c = config;
             py::gil_scoped_release release;
             t.AdoptProcesses(from, c);
           })
      .def("close", &feedline::python::PyTransform::Close)
      .def("take_error", &feedline::python::PyTransform::TakeError)
      .def("take_result", [](const feedline::python::PyTransform& t,
                             int64_t position) { return py::bytes(t.TakeResult(position)); })
      .def("stats", &feedline::python::PyTransform::Stats);

  m.def(
      "python_loader",
      [](std::shared_ptr<feedline::python::PyTransform> transform, int64_t positions,
         uint64_t fingerprint, const py::kwargs& engine) {
        // The positions are the epoch's order already (the torch sampler's, set by
        // PyTransform::SetKeys): the engine runs them as they come, on one rank. "cuda:N" for
        // `device`: pinned slots and the copy stage (every field copied on its side stream).
        feedline::LoaderOptions o = EngineOptions(engine).shuffle(false).rank(0).world_size(1);
        absl::StatusOr<std::unique_ptr<feedline::Loader>> loader;
        {
          py::gil_scoped_release release;
          loader = feedline::Loader::Create(feedline::python::MakePositions(positions, fingerprint),
                                            transform, std::move(o));
        }
        if (!loader.ok()) ThrowStatus(loader.status(), false);
        return LoaderHolder(loader->release());
      },
      py::arg("transform"), py::arg("positions"), py::arg("fingerprint"));

  m.def("option_declarations", &feedline::python::OptionDeclarations,
        "Every loader option as declared in C++ (include/feedline/options.h): a list of (name, "
        "group, default), group \"engine\" or \"image\".");
  m.def("shown_name", [](const std::string& path_or_url) { return feedline::ShownName(path_or_url); },
        py::arg("path_or_url"),
        "The path or URL as feedline's messages show it: a URL without user information, "
        "query or fragment, control characters escaped.");
  m.def("build_info", [] {
    feedline::BuildInfo b = feedline::GetBuildInfo();
    py::dict d;
    d["version"] = b.version;
    d["cuda_compiled"] = b.cuda_compiled;
    d["cuda_devices"] = b.cuda_devices;
    d["cuda_unavailable_reason"] = b.cuda_unavailable_reason;
    d["png"] = b.png;
    d["jpeg"] = b.jpeg;
    d["resize"] = b.resize;
    return d;
  });

  py::class_<ArrayView>(m, "ArrayView")
      .def("__dlpack__", &ArrayView::DLPack, py::arg("stream") = py::none())
      .def("__dlpack_device__", &ArrayView::DLPackDevice)
      .def_property_readonly("shape", &ArrayView::shape);

  py::class_<feedline::Epoch, EpochHolder>(m, "Epoch")
      .def_property_readonly("epoch", &feedline::Epoch::epoch)
      .def("__len__", &feedline::Epoch::num_batches)
      .def("cancel",
           [](feedline::Epoch& e) {
             py::gil_scoped_release release;
             e.Cancel();
           })
      // Returns (images, labels, indices, batch_index) or raises StopIteration.
      .def("next",
           [](feedline::Epoch& e) {
             const feedline::Batch b = NextBatch(e);
             const auto shape = b.image_shape();
             auto keep = std::make_shared<const feedline::Batch>(b);
             const int64_t n = b.size();
             const int device = b.device();
             ArrayView images(keep, const_cast<uint8_t*>(b.images()), DLPackDType(b.dtype()),
                              {shape[0], shape[1], shape[2], shape[3]}, device);
             ArrayView labels(keep, const_cast<int64_t*>(b.labels()), DLDataType{kDLInt, 64, 1},
                              {n}, device);
             ArrayView indices(keep, const_cast<int64_t*>(b.indices()), DLDataType{kDLInt, 64, 1},
                               {n}, -1);
             return py::make_tuple(std::move(images), std::move(labels), std::move(indices),
                                   b.index());
           })
      // Any schema: ({field name: view}, indices, batch_index) or raises StopIteration.
      .def(
          "next_fields",
          [](feedline::Epoch& e, double timeout) {
            const feedline::Batch b = NextBatch(e, timeout);
            auto keep = std::make_shared<const feedline::Batch>(b);
            ArrayView indices(keep, const_cast<int64_t*>(b.indices()), DLDataType{kDLInt, 64, 1},
                              {b.size()}, -1);
            return py::make_tuple(FieldsOf(b), std::move(indices), b.index());
          },
          py::arg("timeout") = 0.0);

  py::class_<feedline::text::PackedEpoch, PackedEpochHolder>(m, "PackedEpoch")
      .def_property_readonly("epoch", &feedline::text::PackedEpoch::epoch)
      .def("__len__",
           [](const feedline::text::PackedEpoch&) -> int64_t {
             throw py::type_error("packed rows per epoch are known only once it is tokenized");
           })
      .def("cancel",
           [](feedline::text::PackedEpoch& e) {
             py::gil_scoped_release release;
             e.Cancel();
           })
      .def("next_fields", [](feedline::text::PackedEpoch& e) {
        const feedline::Batch b = NextBatch(e);
        auto keep = std::make_shared<const feedline::Batch>(b);
        ArrayView indices(keep, const_cast<int64_t*>(b.indices()), DLDataType{kDLInt, 64, 1},
                          {b.size()}, -1);
        return py::make_tuple(FieldsOf(b), std::move(indices), b.index());
      });

  py::class_<feedline::text::PackedLoader>(m, "PackedLoader")
      .def("start_epoch",
           [](feedline::text::PackedLoader& l) {
             std::unique_ptr<feedline::text::PackedEpoch> e;
             {
               py::gil_scoped_release release;
               e = l.StartEpoch();
             }
             return PackedEpochHolder(e.release());
           })
      .def_property_readonly(
          "num_samples",
          [](const feedline::text::PackedLoader& l) { return l.documents().num_samples(); })
      .def("set_epoch", &feedline::text::PackedLoader::set_epoch)
      .def_property_readonly("next_epoch", &feedline::text::PackedLoader::next_epoch)
      .def("state",
           [](const feedline::text::PackedLoader& l) {
             const feedline::text::PackedLoader::State s = l.state();
             py::dict d;
             d["documents"] = StateToDict(s.documents);
             d["batches_done"] = s.batches_done;
             d["document"] = s.document;
             d["offset"] = s.offset;
             d["seq_len"] = s.seq_len;
             d["batch_size"] = s.batch_size;
             d["window_rows"] = s.window_rows;
             d["mode"] = PackModeName(s.mode);
             d["version"] = 1;
             return d;
           })
      .def("load_state",
           [](feedline::text::PackedLoader& l, const py::dict& d, bool resplit) {
             if (resplit) throw py::value_error("resplit: not supported for packed rows");
             for (const char* k : {"documents", "batches_done", "document", "offset", "seq_len",
                                   "batch_size", "window_rows", "mode"}) {
               if (!d.contains(k)) {
                 throw py::value_error(absl::StrCat("state_dict: missing key '", k, "'"));
               }
             }
             feedline::text::PackedLoader::State s;
             if (!py::isinstance<py::dict>(d["documents"])) {
               throw py::type_error("state_dict: 'documents' must be a dict");
             }
             s.documents = DictToState(d["documents"].cast<py::dict>());
             try {
               s.batches_done = d["batches_done"].cast<int64_t>();
               s.document = d["document"].cast<int64_t>();
               s.offset = d["offset"].cast<int64_t>();
               s.seq_len = d["seq_len"].cast<int64_t>();
               s.batch_size = d["batch_size"].cast<int64_t>();
               s.window_rows = d["window_rows"].cast<int64_t>();
               const std::string mode = d["mode"].cast<std::string>();
               s.mode = -1;
               for (int m = 0; m < 3; ++m) {
                 if (mode == PackModeName(m)) s.mode = m;
               }
             } catch (const py::cast_error&) {
               throw py::type_error("state_dict: a value has the wrong type");
             }
             absl::Status st = l.LoadState(s);
             if (!st.ok()) ThrowStatus(st, false);
           })
      .def("save_trace",
           [](const feedline::text::PackedLoader& l, const std::string& path) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = l.documents().SaveTrace(path);
             }
             if (!s.ok()) ThrowStatus(s, false);
           })
      .def("stats",
           [](const feedline::text::PackedLoader& l) {
             py::dict d = StatsToDict(l.documents().stats());
             const feedline::text::PackStats p = l.pack_stats();
             py::dict packing;
             packing["rows"] = p.rows;
             packing["tokens"] = p.tokens;
             packing["slots"] = p.slots;
             packing["documents"] = p.documents;
             packing["truncated"] = p.truncated;
             packing["split"] = p.split;
             packing["empty"] = p.empty;
             packing["cut_documents"] = p.cut_documents;
             packing["cut_tokens"] = p.cut_tokens;
             packing["cut_partly"] = p.cut_partly;
             packing["efficiency"] = p.efficiency();
             d["packing"] = packing;
             return d;
           })
      .def("set_workers",
           [](feedline::text::PackedLoader& l, int n) { l.documents().set_workers(n); })
      .def("set_prefetch",
           [](feedline::text::PackedLoader& l, int n) { l.documents().set_prefetch(n); })
      .def_property_readonly(
          "workers",
          [](const feedline::text::PackedLoader& l) { return l.documents().stats().workers; })
      .def_property_readonly("prefetch", [](const feedline::text::PackedLoader& l) {
        return l.documents().stats().prefetch;
      });

  // A SentencePiece model (a path or URL), loaded once for a TextLoader's loaders.
  py::class_<TokenizerHandle>(m, "Tokenizer").def("counters", [](const TokenizerHandle& h) {
    const feedline::text::Tokenizer::Counters c = h.tokenizer->counters();
    py::dict d;
    d["word_cache"] = c.word_cache;
    d["documents"] = c.documents;
    d["words"] = c.words;
    d["cached_words"] = c.cached_words;
    return d;
  });
  m.def(
      "sentencepiece",
      [](const std::string& model, bool word_cache) {
        absl::StatusOr<std::shared_ptr<const feedline::text::Tokenizer>> t;
        {
          py::gil_scoped_release release;
          t = LoadTokenizer(model, word_cache);
        }
        if (!t.ok()) ThrowStatus(t.status(), false);
        return TokenizerHandle{*std::move(t)};
      },
      py::arg("model"), py::arg("word_cache"));

  py::class_<feedline::text::CutCounter, std::shared_ptr<feedline::text::CutCounter>>(m,
                                                                                      "CutCounter")
      .def_property_readonly("documents",
                             [](const feedline::text::CutCounter& c) { return c.documents.load(); })
      .def_property_readonly("tokens",
                             [](const feedline::text::CutCounter& c) { return c.tokens.load(); })
      .def_property_readonly("partly",
                             [](const feedline::text::CutCounter& c) { return c.partly.load(); });

  py::class_<feedline::Loader, LoaderHolder>(m, "Loader")
      // The image built-in: every declared option (engine and image), by its declared name and
      // type, defaults from the declarations (python/py_options.h).
      .def(py::init([](const py::kwargs& kwargs) {
             feedline::LoaderOptions o;
             feedline::python::SetOptions(
                 kwargs, {feedline::OptionGroup::kEngine, feedline::OptionGroup::kImage}, &o);
             absl::StatusOr<std::unique_ptr<feedline::Loader>> loader;
             {
               py::gil_scoped_release release;
               loader = feedline::Loader::Create(std::move(o));
             }
             if (!loader.ok()) ThrowStatus(loader.status(), false);
             return LoaderHolder(loader->release());
           }))
      .def("start_epoch",
           [](feedline::Loader& l) {
             std::unique_ptr<feedline::Epoch> e;
             {
               py::gil_scoped_release release;
               e = l.StartEpoch();
             }
             return EpochHolder(e.release());
           })
      .def("__len__", &feedline::Loader::num_batches)
      .def_property_readonly("num_samples", &feedline::Loader::num_samples)
      .def_property_readonly("classes",
                             [](const feedline::Loader& l) { return FilesOf(l).classes; })
      .def_property_readonly("samples",
                             [](const feedline::Loader& l) {
                               py::list out;
                               for (const feedline::Sample& s : FilesOf(l).samples) {
                                 out.append(py::make_tuple(s.path, s.label));
                               }
                               return out;
                             })
      .def("set_epoch", &feedline::Loader::set_epoch)
      .def("state", [](const feedline::Loader& l) { return StateToDict(l.state()); })
      .def("load_state",
           [](feedline::Loader& l, const py::dict& d, bool resplit) {
             absl::Status st = l.LoadState(DictToState(d), resplit);
             if (!st.ok()) ThrowStatus(st, false);
           })
      .def("save_trace",
           [](const feedline::Loader& l, const std::string& path) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = l.SaveTrace(path);
             }
             if (!s.ok()) ThrowStatus(s, false);
           })
      .def_property_readonly("next_epoch", &feedline::Loader::next_epoch)
      .def("stats", [](const feedline::Loader& l) { return StatsToDict(l.stats()); })
      .def("set_workers", &feedline::Loader::set_workers)
      .def("set_prefetch", &feedline::Loader::set_prefetch)
      .def("set_io_depth", &feedline::Loader::set_io_depth)
      .def_property_readonly("workers", [](const feedline::Loader& l) { return l.stats().workers; })
      .def_property_readonly("prefetch",
                             [](const feedline::Loader& l) { return l.stats().prefetch; })
      .def_property_readonly("io_depth",
                             [](const feedline::Loader& l) { return l.stats().io_depth; })
      .def_property_readonly("memory_budget",
                             [](const feedline::Loader& l) { return l.options().memory_budget(); });
}
