#include "bind_common.h"

#include <pybind11/stl.h>

#include <type_traits>

#include "absl/strings/numbers.h"
#include "feedline/error.h"
#include "py_options.h"

namespace feedline::python {
namespace {

py::object g_data_error;
py::object g_device_error;

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

}  // namespace

void RegisterErrors(py::module_& m) {
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
}
py::handle DataErrorType() { return g_data_error; }
py::handle DeviceErrorType() { return g_device_error; }

py::object ArrayView::DLPack(py::object stream) const {
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
        stream_value == -1 ? kNoSyncStream : reinterpret_cast<void*>(stream_value);
    absl::Status st;
    {
      py::gil_scoped_release release;
      st = batch_->set_consumer_stream(s);
    }
    if (!st.ok()) {
      PyErr_SetString(DeviceErrorType().ptr(),
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

DLDataType DLPackDType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return DLDataType{kDLFloat, 32, 1};
    case DType::kFloat16:
      return DLDataType{kDLFloat, 16, 1};
    case DType::kBFloat16:
      return DLDataType{kDLBfloat, 16, 1};
    case DType::kInt32:
      return DLDataType{kDLInt, 32, 1};
    case DType::kInt64:
      return kDLInt64;
    case DType::kFloat64:
      return DLDataType{kDLFloat, 64, 1};
    case DType::kInt8:
      return DLDataType{kDLInt, 8, 1};
    case DType::kInt16:
      return DLDataType{kDLInt, 16, 1};
    case DType::kUint8:
    case DType::kBytes:
    case DType::kBool:  // torch 1.13 takes no DLPack bool: uint8, viewed as bool
      break;
  }
  return DLDataType{kDLUInt, 8, 1};
}

[[noreturn]] void ThrowStatus(const absl::Status& s, bool sample_error) {
  const std::string msg(s.message());
  if (IsDeviceError(s)) {  // a GPU failure is never a bad sample
    PyErr_SetString(DeviceErrorType().ptr(), msg.c_str());
    throw py::error_already_set();
  }
  if (sample_error) {
    PyErr_SetString(DataErrorType().ptr(), msg.c_str());
    throw py::error_already_set();
  }
  switch (s.code()) {
    case absl::StatusCode::kDataLoss:  // a damaged file (a shard's index, ...): data, not args
      PyErr_SetString(DataErrorType().ptr(), msg.c_str());
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

py::dict FieldsOf(const Batch& b) {
  auto keep = std::make_shared<const Batch>(b);
  py::dict out;
  const int64_t n = b.size();
  for (int f = 0; f < b.num_fields(); ++f) {
    const TensorView v = b.field(f);
    const std::string name = b.schema().field(f).name();
    out[py::str(name)] = ArrayView(keep, v.data, DLPackDType(v.dtype), v.shape, v.device);
    if (v.ragged()) {
      out[py::str(name + "_offsets")] =
          ArrayView(keep, const_cast<int64_t*>(v.offsets), kDLInt64, {n + 1}, -1);
    } else if (v.lengths != nullptr) {
      out[py::str(name + "_lengths")] =
          ArrayView(keep, const_cast<int64_t*>(v.lengths), kDLInt64, {n}, -1);
    }
  }
  return out;
}

py::tuple FieldsTuple(const Batch& b) {
  auto keep = std::make_shared<const Batch>(b);
  ArrayView indices(keep, const_cast<int64_t*>(b.indices()), kDLInt64, {b.size()}, -1);
  return py::make_tuple(FieldsOf(b), std::move(indices), b.index());
}

LoaderOptions EngineOptions(const py::kwargs& kwargs) {
  LoaderOptions o;
  SetOptions(kwargs, {OptionGroup::kEngine}, &o);
  return o;
}


MixOptions MixOptionsOf(uint64_t seed, const std::string& end, int64_t samples_per_epoch,
                        bool shuffle) {
  MixOptions o;
  if (end == "first_source") {
    o.end = MixOptions::End::kFirstSource;
  } else if (end == "last_source") {
    o.end = MixOptions::End::kLastSource;
  } else {
    throw py::value_error(
        absl::StrCat("end: expected 'first_source' or 'last_source', got '", end, "'"));
  }
  o.seed = seed;
  o.samples_per_epoch = samples_per_epoch;
  o.shuffle = shuffle;
  return o;
}

py::dict StatsToDict(const Stats& s) {
  py::dict d;
  d["elapsed_s"] = s.elapsed_s;
  d["samples"] = s.samples;
  d["batches"] = s.batches;
  d["samples_per_s"] = s.samples_per_s;
  d["consumer_wait_s"] = s.consumer_wait_s;
  d["consumer_wait_fraction"] = s.consumer_wait_fraction;
  d["epoch_start_wait_s"] = s.epoch_start_wait_s;
  d["consumer_cpu_s"] = s.consumer_cpu_s;
  d["consumer_run_delay_s"] = s.consumer_run_delay_s;
  d["worker_nice"] = s.worker_nice;
  py::dict stages;
  for (const StageStats& st : s.stages) {
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
  d["demand_samples_per_s"] = s.demand_samples_per_s;
  d["map_ms_per_sample"] = s.map_ms_per_sample;
  d["read_ms"] = s.read_ms;
  d["trainer"] = py::dict(py::arg("cores") = s.trainer_cores,
                          py::arg("cores_left") = s.cores_left_to_trainer,
                          py::arg("reason") = s.trainer_reason);
  py::list tuning;
  for (const TuningEvent& t : s.tuning) {
    tuning.append(py::dict(py::arg("time_s") = t.time_s, py::arg("workers") = t.workers,
                           py::arg("io_depth") = t.io_depth, py::arg("prefetch") = t.prefetch,
                           py::arg("samples_per_s") = t.samples_per_s,
                           py::arg("reason") = t.reason));
  }
  d["tuning"] = tuning;
  py::list timeline;
  for (const TimelinePoint& t : s.timeline) {
    timeline.append(
        py::dict(py::arg("time_s") = t.time_s, py::arg("samples_per_s") = t.samples_per_s,
                 py::arg("consumer_wait_fraction") = t.consumer_wait_fraction,
                 py::arg("workers") = t.workers, py::arg("io_depth") = t.io_depth,
                 py::arg("prefetch") = t.prefetch, py::arg("bytes_in_use") = t.bytes_in_use));
  }
  d["timeline"] = timeline;
  d["cache"] = py::dict(py::arg("kind") = s.cache, py::arg("hits") = s.cache_hits,
                        py::arg("misses") = s.cache_misses, py::arg("bytes") = s.cache_bytes,
                        py::arg("budget") = s.cache_budget);
  py::dict transform;
  for (const auto& [name, value] : s.transform_counters) transform[py::str(name)] = value;
  d["transform"] = transform;
  d["error_count"] = s.error_count;
  if (s.remote.remote) {
    py::dict r;
    r["requests"] = s.remote.requests;
    r["retries"] = s.remote.retries;
    r["failures"] = s.remote.failures;
    r["bytes"] = s.remote.bytes;
    r["in_flight"] = s.remote.in_flight;
    r["request_ms"] = s.remote.request_ms;
    r["damaged_copies"] = s.remote.damaged_copies;
    d["remote"] = r;
  }
  py::list errors;
  for (const SampleError& e : s.errors) {
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


py::dict StateToDict(const Loader::State& s) {
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
  d["skipped"] = s.skipped;
  d["version"] = 1;
  return d;
}

Loader::State DictToState(const py::dict& d) {
  const char* keys[] = {"epoch",        "batches_done",       "seed",    "rank",
                        "world_size",   "batch_size",         "shuffle", "drop_last",
                        "dataset_size", "dataset_fingerprint"};
  for (const char* k : keys) {
    if (!d.contains(k)) throw py::value_error(absl::StrCat("state_dict: missing key '", k, "'"));
  }
  Loader::State s;
  // Each value cast on its own, so that a wrong one is named (bool is not an int here).
  StateValue(d, "epoch", &s.epoch);
  StateValue(d, "batches_done", &s.batches_done);
  StateValue(d, "seed", &s.seed);
  StateValue(d, "rank", &s.rank);
  StateValue(d, "world_size", &s.world_size);
  StateValue(d, "batch_size", &s.batch_size);
  StateValue(d, "shuffle", &s.shuffle);
  StateValue(d, "drop_last", &s.drop_last);
  StateValue(d, "dataset_size", &s.dataset_size);
  // Absent from states saved before resumes on other layouts were exact: none was resplit.
  if (d.contains("skipped")) StateValue(d, "skipped", &s.skipped);
  const py::handle fp = d["dataset_fingerprint"];
  if (!py::isinstance<py::str>(fp) ||
      !absl::SimpleHexAtoi(fp.cast<std::string>(), &s.dataset_fingerprint)) {
    throw py::type_error("state_dict: 'dataset_fingerprint' must be a hex string");
  }
  return s;
}

}  // namespace feedline::python
