// The `feedline._feedline` extension: the C++ loaders for Python, one translation unit per face
// (bind_engine.cc, bind_image.cc, bind_text.cc, bind_python.cc, bind_video.cc) over what they share
// (bind_common.h: DLPack, errors, the GIL, stats and states). Bindings only: every loader is
// made by a C++ factory a C++ program can call too.
#include <pybind11/pybind11.h>

#include "bind_common.h"

PYBIND11_MODULE(_feedline, m) {
  m.doc() = "feedline: the C++ loaders (images, text and tokens, video clips, Python data sets)";
  feedline::python::RegisterErrors(m);
  feedline::python::BindEngine(m);
  feedline::python::BindImage(m);
  feedline::python::BindText(m);
  feedline::python::BindPython(m);
  feedline::python::BindVideo(m);
}
