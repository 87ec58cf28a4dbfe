// The image built-in's face (feedline.ImageLoader): a loader from every declared option of the
// engine and the image groups, and the image folder's classes and samples.
#include <pybind11/stl.h>

#include <memory>
#include <utility>

#include "bind_common.h"
#include "feedline/files.h"
#include "feedline/loader.h"
#include "py_options.h"

namespace feedline::python {
namespace {

// The image built-in's data set is a FileDataset (classes, samples); empty for another.
const FileList& FilesOf(const Loader& l) {
  static const FileList* none = new FileList();
  const auto* files = dynamic_cast<const FileDataset*>(&l.dataset());
  return files != nullptr ? files->files() : *none;
}

}  // namespace

void BindImage(py::module_& m) {
  // Every declared option (engine and image), by its declared name and type, defaults from the
  // declarations (python/py_options.h).
  m.def(
      "image_loader",
      [](const py::kwargs& kwargs) {
        LoaderOptions o;
        SetOptions(kwargs, {OptionGroup::kEngine, OptionGroup::kImage}, &o);
        return LoaderHolder(Unlocked([&] { return Loader::Create(std::move(o)); }).release());
      },
      OptionsDocstring("The image built-in's loader (feedline.ImageLoader's engine), from these "
                       "keyword arguments, the declared options:",
                       {OptionGroup::kEngine, OptionGroup::kImage}));
  m.def(
      "image_classes", [](const Loader& l) { return FilesOf(l).classes; }, py::arg("loader"),
      "Class names of an image loader's folder, in torchvision's order (empty for list files).");
  m.def(
      "image_samples",
      [](const Loader& l) {
        py::list out;
        for (const Sample& s : FilesOf(l).samples) out.append(py::make_tuple(s.path, s.label));
        return out;
      },
      py::arg("loader"), "(path, class index) of every sample of an image loader.");
}

}  // namespace feedline::python
