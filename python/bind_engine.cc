// The engine's face, shared by every loader: the Loader handle (epochs, resume state, stats,
// resources), its epochs' batches as DLPack arrays, and what the build and the declarations say.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bind_common.h"
#include "feedline/error.h"
#include "feedline/loader.h"
#include "py_options.h"

namespace feedline::python {

void BindEngine(py::module_& m) {
  m.def("option_declarations", &OptionDeclarations,
        "Every loader option as declared in C++ (include/feedline/options.h): a list of (name, "
        "group, default, doc), group \"engine\" or \"image\".");
  m.def(
      "worker_nice",
      [](const py::kwargs& kwargs) {
        absl::StatusOr<int> nice = ResolvedWorkerNice(EngineOptions(kwargs));
        if (!nice.ok()) ThrowStatus(nice.status(), /*sample_error=*/false);
        return *nice;
      },
      "The nice level below the loading process that map workers and worker processes run at: "
      "worker_nice= (declared default), or FEEDLINE_WORKER_NICE when set.");
  m.def(
      "shown_name", [](const std::string& path_or_url) { return ShownName(path_or_url); },
      py::arg("path_or_url"),
      "The path or URL as feedline's messages show it: a URL without user information, "
      "query or fragment, control characters escaped.");
  m.def("build_info", [] {
    BuildInfo b = GetBuildInfo();
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

  py::class_<Epoch, EpochHolder>(m, "Epoch")
      .def_property_readonly("epoch", &Epoch::epoch)
      .def("__len__", &Epoch::num_batches)
      .def("cancel",
           [](Epoch& e) {
             py::gil_scoped_release release;
             e.Cancel();
           })
      // The image schema: (images, labels, indices, batch_index) or raises StopIteration.
      .def("next",
           [](Epoch& e) {
             const Batch b = NextBatch(e);
             const auto shape = b.image_shape();
             auto keep = std::make_shared<const Batch>(b);
             const int64_t n = b.size();
             const int device = b.device();
             ArrayView images(keep, const_cast<uint8_t*>(b.images()), DLPackDType(b.dtype()),
                              {shape[0], shape[1], shape[2], shape[3]}, device);
             ArrayView labels(keep, const_cast<int64_t*>(b.labels()), kDLInt64, {n}, device);
             ArrayView indices(keep, const_cast<int64_t*>(b.indices()), kDLInt64, {n}, -1);
             return py::make_tuple(std::move(images), std::move(labels), std::move(indices),
                                   b.index());
           })
      // Any schema: ({field name: view}, indices, batch_index) or raises StopIteration.
      .def(
          "next_fields", [](Epoch& e, double timeout) { return NextFields(e, timeout); },
          py::arg("timeout") = 0.0);

  // An epoch's batches shared between a loader's run and other makers (offload).
  py::class_<BatchFeed, std::shared_ptr<BatchFeed>>(m, "BatchFeed")
      .def(py::init<int64_t, int64_t>(), py::arg("first"), py::arg("end"))
      .def(
          "claim_remote",
          [](BatchFeed& f, int64_t lead) { return f.Claim(BatchFeed::kRemote, lead); },
          py::arg("lead") = 0)
      // 0: nobody's yet, 1: the loader's run, 2: another maker's.
      .def("owner", [](const BatchFeed& f, int64_t b) { return int(f.owner(b)); })
      .def("close", &BatchFeed::Close)
      .def("take_remote", [](BatchFeed& f, int64_t b) { return f.Take(b, BatchFeed::kRemote); })
      .def_property_readonly("unclaimed", &BatchFeed::unclaimed)
      .def_property_readonly("first", &BatchFeed::first)
      .def_property_readonly("end", &BatchFeed::end);

  // Made by the faces' factories (image_loader, token_loader, text_loader, python_loader).
  py::class_<Loader, LoaderHolder>(m, "Loader")
      .def("start_epoch",
           [](Loader& l) {
             std::unique_ptr<Epoch> e;
             {
               py::gil_scoped_release release;
               e = l.StartEpoch();
             }
             return EpochHolder(e.release());
           })
      // Only these batches of an epoch (offload: the rest are made elsewhere).
      .def("start_batches",
           [](Loader& l, int64_t epoch, std::vector<int64_t> batches) {
             absl::StatusOr<std::unique_ptr<Epoch>> e;
             {
               py::gil_scoped_release release;
               e = l.StartBatches(epoch, std::move(batches));
             }
             if (!e.ok()) ThrowStatus(e.status(), false);
             return EpochHolder(e->release());
           })
      // The batches of `feed` that this run claims as it has room (offload).
      .def("start_from_feed",
           [](Loader& l, int64_t epoch, std::shared_ptr<BatchFeed> feed) {
             absl::StatusOr<std::unique_ptr<Epoch>> e;
             {
               py::gil_scoped_release release;
               e = l.StartFromFeed(epoch, std::move(feed));
             }
             if (!e.ok()) ThrowStatus(e.status(), false);
             return EpochHolder(e->release());
           })
      .def("__len__", &Loader::num_batches)
      .def_property_readonly("num_samples", &Loader::num_samples)
      .def("set_epoch", &Loader::set_epoch)
      .def("state", [](const Loader& l) { return StateToDict(l.state()); })
      .def("load_state",
           [](Loader& l, const py::dict& d, bool resplit) {
             absl::Status st = l.LoadState(DictToState(d), resplit);
             if (!st.ok()) ThrowStatus(st, false);
           })
      .def("save_trace",
           [](const Loader& l, const std::string& path) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = l.SaveTrace(path);
             }
             if (!s.ok()) ThrowStatus(s, false);
           })
      .def_property_readonly("next_epoch", &Loader::next_epoch)
      .def("drop_ahead",
           [](Loader& l) {
             py::gil_scoped_release release;
             l.DropAhead();
           })
      .def("start_ahead",
           [](Loader& l, int64_t epoch) {
             py::gil_scoped_release release;
             return l.StartAhead(epoch);
           })
      .def("stats", [](const Loader& l) { return StatsToDict(l.stats()); })
      .def("set_workers", &Loader::set_workers)
      .def("set_prefetch", &Loader::set_prefetch)
      .def("set_io_depth", &Loader::set_io_depth)
      .def_property_readonly("workers", [](const Loader& l) { return l.stats().workers; })
      .def_property_readonly("prefetch", [](const Loader& l) { return l.stats().prefetch; })
      .def_property_readonly("io_depth", [](const Loader& l) { return l.stats().io_depth; })
      .def_property_readonly("on_error",
                             [](const Loader& l) { return EnumName(l.options().on_error()); })
      .def_property_readonly("memory_budget",
                             [](const Loader& l) { return l.options().memory_budget(); });
}

}  // namespace feedline::python
