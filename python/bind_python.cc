// Python data sets' face (feedline.DataLoader): the transform that runs a Python Dataset in
// threads or worker processes (python/py_dataset.h), and the engine around it.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bind_common.h"
#include "py_dataset.h"
#include "py_options.h"

namespace feedline::python {
namespace {

// A worker process's whole-batch reply, held once: Python reads it through the buffer protocol
// (writable, so that torch.frombuffer makes the batch's tensors views of it without a copy or a
// warning; they keep it alive).
struct OwnedBytes {
  std::string data;
};

}  // namespace

void BindPython(py::module_& m) {
  py::class_<OwnedBytes>(m, "_OwnedBytes", py::buffer_protocol())
      .def_buffer([](OwnedBytes& b) {
        return py::buffer_info(b.data.data(), 1, py::format_descriptor<uint8_t>::format(),
                               py::ssize_t(b.data.size()));
      })
      .def("__len__", [](const OwnedBytes& b) { return b.data.size(); });
  py::class_<PyTransform, std::shared_ptr<PyTransform>>(m, "PythonTransform")
      .def(py::init([](const py::list& fields, bool batch_mode, py::object fetch) {
             // fields: (name, dtype, shape, ragged[, pad_value]) with -n for a variable
             // dimension up to n (padded to the batch's longest with pad_value, or ragged)
             std::vector<Field> out;
             for (const py::handle& h : fields) {
               auto t = h.cast<py::tuple>();
               std::vector<Dim> shape;
               for (int64_t d : t[2].cast<std::vector<int64_t>>()) {
                 shape.push_back(d < 0 ? Dim::UpTo(-d) : Dim(d));
               }
               Field f(t[0].cast<std::string>(), EnumFromPython<DType>("dtype", t[1]),
                       std::move(shape));
               if (t[3].cast<bool>()) f.collate(Collate::kRagged);
               if (t.size() > 4) f.pad_value(t[4].cast<double>());
               out.push_back(std::move(f));
             }
             Schema schema(std::move(out));
             absl::Status st = schema.Validate();
             if (!st.ok()) ThrowStatus(st, false);
             return std::make_shared<PyTransform>(std::move(schema), batch_mode, std::move(fetch));
           }),
           py::arg("fields"), py::arg("batch_mode"), py::arg("fetch"))
      .def("use_processes", &PyTransform::UseProcesses)
      .def("stop_processes",
           [](PyTransform& t) {
             py::gil_scoped_release release;
             t.StopProcesses();
           })
      .def_property_readonly("processes", &PyTransform::processes)
      .def("set_keys", &PyTransform::SetKeys, py::arg("keys"), py::arg("offsets"),
           py::arg("seed") = 0, py::arg("first_index") = 0, py::arg("first_batch") = 0,
           py::arg("positions_per_batch") = 1, py::arg("chunk") = 1)
      .def("set_keys_ahead", &PyTransform::SetKeysAhead, py::arg("epoch"), py::arg("keys"),
           py::arg("offsets"), py::arg("seed"), py::arg("positions_per_batch"), py::arg("chunk"))
      .def("adopt_ahead", &PyTransform::AdoptAhead)
      .def("forget_ahead", &PyTransform::ForgetAhead)
      .def("set_timeout", &PyTransform::set_timeout_s)
      .def("adopt_processes",
           [](PyTransform& t, PyTransform& from, const py::bytes& config) {
             std::string c = config;
             py::gil_scoped_release release;
             t.AdoptProcesses(from, c);
           })
      .def("close", &PyTransform::Close)
      .def("take_error", &PyTransform::TakeError)
      .def("take_result",
           [](const PyTransform& t, int64_t position) {
             return std::make_unique<OwnedBytes>(OwnedBytes{t.TakeResult(position)});
           })
      .def("stats", &PyTransform::Stats);

  m.def(
      "python_loader",
      [](std::shared_ptr<PyTransform> transform, int64_t positions, uint64_t fingerprint,
         const py::kwargs& engine) {
        // The positions are the epoch's order already (the torch sampler's, set by
        // PyTransform::SetKeys): the engine runs them as they come, on one rank. "cuda:N" for
        // `device`: pinned slots and the copy stage (every field copied on its side stream).
        LoaderOptions o = EngineOptions(engine).shuffle(false).rank(0).world_size(1);
        return LoaderHolder(Unlocked([&] {
                              return Loader::Create(MakePositions(positions, fingerprint),
                                                    transform, std::move(o));
                            }).release());
      },
      py::arg("transform"), py::arg("positions"), py::arg("fingerprint"));
}

}  // namespace feedline::python
