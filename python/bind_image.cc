// The image built-in's face (feedline.ImageLoader): a loader from every declared option of the
// engine and the image groups, and the image folder's classes and samples.
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bind_common.h"
#include "feedline/files.h"
#include "feedline/loader.h"
#include "feedline/mix.h"
#include "py_options.h"

namespace feedline::python {
namespace {

// The image built-in's data set is a FileDataset (classes, samples); empty for another.
const FileList& FilesOf(const Dataset& d) {
  static const FileList* none = new FileList();
  const Dataset* p = &d;  // through wrappers (a video loader's several clips per file)
  while (const auto* w = dynamic_cast<const DatasetWrapper*>(p)) p = &w->target();
  const auto* files = dynamic_cast<const FileDataset*>(p);
  return files != nullptr ? files->files() : *none;
}

// (path, label) of every record: a mixture's are its sources' one after the other.
py::list SamplesOf(const Dataset& d) {
  py::list out;
  if (const auto* mix = dynamic_cast<const Mix*>(&d)) {
    for (int s = 0; s < mix->num_sources(); ++s) {
      for (const py::handle h : SamplesOf(mix->dataset(s))) out.append(h);
    }
    return out;
  }
  for (const Sample& s : FilesOf(d).samples) out.append(py::make_tuple(s.path, s.label));
  return out;
}


}  // namespace

void BindImage(py::module_& m) {
  // Every declared option (engine and image), by its declared name and type, defaults from the
  // declarations (python/py_options.h).
  m.def(
      "image_loader",
      [](py::kwargs kwargs) {
        // dataset=: a Mix (mix_dataset) instead of the options' source.
        // source_options=: with a Mix, each source's own image options (dicts).
        std::shared_ptr<Mix> mix;
        if (kwargs.contains("dataset")) {
          mix = kwargs.attr("pop")("dataset").cast<std::shared_ptr<Mix>>();
        }
        py::list per;
        if (kwargs.contains("source_options")) {
          per = kwargs.attr("pop")("source_options").cast<py::list>();
        }
        LoaderOptions o;
        SetOptions(kwargs, {OptionGroup::kEngine, OptionGroup::kImage}, &o);
        std::vector<LoaderOptions> sources;
        for (const py::handle h : per) {
          LoaderOptions own = o;
          SetOptions(h.cast<py::dict>(), {OptionGroup::kImage}, &own);
          sources.push_back(std::move(own));
        }
        return LoaderHolder(Unlocked([&] {
                              return mix == nullptr ? Loader::Create(std::move(o))
                                     : sources.empty()
                                         ? Loader::CreateImages(mix, std::move(o))
                                         : Loader::CreateImages(mix, sources, std::move(o));
                            }).release());
      },
      OptionsDocstring("The image built-in's loader (feedline.ImageLoader's engine), from these "
                       "keyword arguments, the declared options:",
                       {OptionGroup::kEngine, OptionGroup::kImage}));
  m.def(
      "image_classes", [](const Loader& l) { return FilesOf(l.dataset()).classes; },
      py::arg("loader"),
      "Class names of an image loader's folder, in torchvision's order (empty for list files "
      "and mixtures).");
  m.def(
      "image_samples", [](const Loader& l) { return SamplesOf(l.dataset()); }, py::arg("loader"),
      "(path, class index) of every record of an image loader (a mixture's: its sources', one "
      "after the other).");

  py::class_<Mix, std::shared_ptr<Mix>>(m, "Mix")
      .def_property_readonly("num_sources", &Mix::num_sources)
      .def_property_readonly("size", &Mix::size)
      .def("offset", &Mix::offset)
      .def("weight", &Mix::weight)
      .def("per_epoch", &Mix::per_epoch)
      .def("reads", &Mix::reads);
  m.def(
      "mix_dataset",
      [](const py::list& sources, const std::vector<double>& weights, uint64_t seed,
         const std::string& end, int64_t samples_per_epoch, bool shuffle, double read_timeout_ms,
         int64_t max_record_bytes, int64_t memory_budget) {
        // Each source: a path, pattern or URL (str), or a list of shard paths.
        std::vector<std::pair<std::string, std::vector<std::string>>> opened;
        for (const py::handle h : sources) {
          if (py::isinstance<py::str>(h)) {
            opened.push_back({h.cast<std::string>(), {}});
          } else {
            opened.push_back({"", h.cast<std::vector<std::string>>()});
          }
        }
        const MixOptions o = MixOptionsOf(seed, end, samples_per_epoch, shuffle);
        return Unlocked([&]() -> absl::StatusOr<std::shared_ptr<Mix>> {
          std::vector<MixSource> mix;
          for (size_t s = 0; s < opened.size(); ++s) {
            absl::StatusOr<std::shared_ptr<FileDataset>> files =
                FileDataset::Open(opened[s].first, opened[s].second,
                                  ReadLimits{read_timeout_ms, max_record_bytes, memory_budget / 2});
            if (!files.ok()) return files.status();
            mix.push_back({*std::move(files), weights.at(s)});
          }
          return Mix::Create(std::move(mix), o);
        });
      },
      py::arg("sources"), py::arg("weights"), py::arg("seed"), py::arg("end"),
      py::arg("samples_per_epoch"), py::arg("shuffle"), py::arg("read_timeout_ms"),
      py::arg("max_record_bytes") = LoaderOptions().max_record_bytes(),
      py::arg("memory_budget") = LoaderOptions().memory_budget(),
      "A weighted mixture of image sources (feedline/mix.h), for image_loader(dataset=).");
}

}  // namespace feedline::python
