// What every face of the `feedline._feedline` extension shares: batches out through DLPack,
// errors in, the GIL released where a call may block, stats and resume states as dicts.
//
// Tensors leave through DLPack (`__dlpack__` / `__dlpack_device__`), zero-copy: the capsule
// owns a reference to the batch's slot, and the slot returns to the ring when the consumer's
// tensor dies. No LibTorch, no libtorch_python: any DLPack consumer works.
//
// The GIL is released around every call that may block (waiting for a batch, creating a
// loader, destroying an epoch, which joins its threads). The capsule deleter touches no Python
// object, so it may run on any thread, with or without the GIL.
#ifndef FEEDLINE_PYTHON_BIND_COMMON_H_
#define FEEDLINE_PYTHON_BIND_COMMON_H_

#include <pybind11/pybind11.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "feedline/loader.h"
#include "feedline/mix.h"

namespace feedline::python {

namespace py = pybind11;

// Each face's bindings (one translation unit each), called by the module's init.
void BindEngine(py::module_& m);  // Loader, Epoch, ArrayView, build info, declarations
void BindImage(py::module_& m);   // the image built-in's loader
void BindText(py::module_& m);    // tokenizers, token and text loaders, packed rows
void BindPython(py::module_& m);  // Python data sets (feedline.DataLoader)
void BindVideo(py::module_& m);   // the video built-in's loader

// feedline.DataError and feedline.DeviceError (made by RegisterErrors at module import).
void RegisterErrors(py::module_& m);
py::handle DataErrorType();
py::handle DeviceErrorType();

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

// One array of a batch (images, labels or indices), exported through DLPack.
class ArrayView {
 public:
  ArrayView(std::shared_ptr<const Batch> batch, void* data, DLDataType dtype,
            std::vector<int64_t> shape, int device)
      : batch_(std::move(batch)),
        data_(data),
        dtype_(dtype),
        shape_(std::move(shape)),
        device_(device) {}

  // `stream` follows the DLPack protocol: None, or the consumer's stream as an int (1: CUDA's
  // legacy default stream, 2: per-thread default, else a cudaStream_t; -1: no synchronisation).
  py::object DLPack(py::object stream) const;
  py::tuple DLPackDevice() const {
    return device_ >= 0 ? py::make_tuple(int(kDLCUDA), device_) : py::make_tuple(int(kDLCPU), 0);
  }
  std::vector<int64_t> shape() const { return shape_; }

 private:
  std::shared_ptr<const Batch> batch_;
  void* data_;
  DLDataType dtype_;
  std::vector<int64_t> shape_;
  int device_;
};

DLDataType DLPackDType(DType t);
inline constexpr DLDataType kDLInt64{kDLInt, 64, 1};

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
using EpochHolder = std::unique_ptr<Epoch, ReleaseGilDeleter>;
// A loader's destructor may wait for its threads, which may wait for the GIL (Python data sets).
using LoaderHolder = std::unique_ptr<Loader, ReleaseGilDeleter>;

// Raises the Python error for `s`: DataError for a sample's error (`sample_error`) or damaged
// data, DeviceError for a GPU failure, else ValueError, FileNotFoundError, PermissionError,
// ConnectionError or RuntimeError by its code.
[[noreturn]] void ThrowStatus(const absl::Status& s, bool sample_error);

// Runs `make` (returning a StatusOr: a loader's factory) with the GIL released; its value, or
// its error raised as Python's.
template <typename F>
auto Unlocked(F make) {
  decltype(make()) made;
  {
    py::gil_scoped_release release;
    made = make();
  }
  if (!made.ok()) ThrowStatus(made.status(), false);
  return *std::move(made);
}

// The epoch's next batch, waiting with the GIL released (and Ctrl-C honoured); StopIteration at
// the end, the sample's error (DataError, DeviceError, ...) when it failed. `timeout_s` > 0:
// RuntimeError when no batch came within it, as torch's DataLoader(timeout=) raises (the batch
// stays queued: a later call may still get it).
template <typename E>  // Epoch, text::PackedEpoch
Batch NextBatch(E& e, double timeout_s = 0) {
  absl::StatusOr<Batch> batch;
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
py::dict FieldsOf(const Batch& b);
// A batch as ({field name: view}, indices, batch_index): views that keep the batch alive.
py::tuple FieldsTuple(const Batch& b);

// The epoch's next batch as FieldsTuple.
template <typename E>
py::tuple NextFields(E& e, double timeout_s = 0) {
  return FieldsTuple(NextBatch(e, timeout_s));
}

// The engine's options as the generic loaders (token_loader, text_loader, ...) take them: their
// declared names, types and defaults (python/py_options.h).
LoaderOptions EngineOptions(const py::kwargs& kwargs);

py::dict StatsToDict(const Stats& s);

// A mixture's options as the faces give them (feedline.Mix and the loader's seed and shuffle);
// ValueError for an `end` other than "first_source" or "last_source".
MixOptions MixOptionsOf(uint64_t seed, const std::string& end, int64_t samples_per_epoch,
                        bool shuffle);
// A resume state as a dict, and back (every key checked: missing, wrong type, out of range).
py::dict StateToDict(const Loader::State& s);
// `d[key]` into `out`, named when it is wrong: a bool only for a bool (TypeError), an int in
// range for an integer (TypeError, ValueError).
template <typename T>
void StateValue(const py::dict& d, const char* key, T* out) {
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
}
Loader::State DictToState(const py::dict& d);

}  // namespace feedline::python

#endif  // FEEDLINE_PYTHON_BIND_COMMON_H_
