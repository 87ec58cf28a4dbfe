#include "py_options.h"

#include <pybind11/stl.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace py = pybind11;

namespace feedline::python {
namespace {

std::string TypeOf(py::handle v) { return Py_TYPE(v.ptr())->tp_name; }

template <typename T>
const char* Expected() {
  if constexpr (std::is_same_v<T, bool>) return "a bool";
  if constexpr (std::is_integral_v<T>) return "an int";
  if constexpr (std::is_floating_point_v<T>) return "a number";
  if constexpr (std::is_same_v<T, std::string>) return "a str";
  if constexpr (std::is_same_v<T, std::vector<std::string>>) return "a list of str";
  if constexpr (std::is_same_v<T, std::pair<double, double>>) return "a pair of numbers";
  if constexpr (std::is_same_v<T, std::array<double, 3>>) return "three numbers";
  return "a value";
}

template <typename T>
void FromPython(const char* name, py::handle v, T* out) {
  if constexpr (std::is_enum_v<T>) {
    *out = EnumFromPython<T>(name, v);
  } else {
    // A bool is an int to Python: refused where a count is meant, and only bools are bools.
    if (py::isinstance<py::bool_>(v) != std::is_same_v<T, bool>) {
      throw py::type_error(absl::StrCat(name, ": expected ", Expected<T>(), ", got ", TypeOf(v)));
    }
    try {
      *out = v.cast<T>();
    } catch (const py::cast_error&) {
      throw py::type_error(absl::StrCat(name, ": expected ", Expected<T>(), ", got ", TypeOf(v),
                                        std::is_integral_v<T> ? " (or out of range)" : ""));
    }
  }
}

template <typename T>
py::object ToPython(const T& v) {
  if constexpr (std::is_enum_v<T>) {
    return py::str(EnumName(v));
  } else if constexpr (std::is_same_v<T, std::array<double, 3>>) {
    return py::make_tuple(v[0], v[1], v[2]);
  } else {
    return py::cast(v);  // a pair becomes a tuple
  }
}

const char* GroupName(OptionGroup g) { return g == OptionGroup::kEngine ? "engine" : "image"; }

}  // namespace

void SetOptions(const py::dict& kwargs, std::initializer_list<OptionGroup> groups,
                LoaderOptions* options) {
  size_t used = 0;
  options->ForEachOption([&](const OptionInfo& info, auto& field) {
    bool in_group = false;
    for (OptionGroup g : groups) in_group = in_group || g == info.group;
    if (!in_group || !kwargs.contains(info.name)) return;
    FromPython(info.name, kwargs[info.name], &field);
    ++used;
  });
  if (used == kwargs.size()) return;
  for (const auto& item : kwargs) {
    const std::string key = py::str(item.first);
    bool known = false;
    options->ForEachOption([&](const OptionInfo& info, const auto&) {
      for (OptionGroup g : groups) known = known || (g == info.group && key == info.name);
    });
    if (!known) throw py::type_error(absl::StrCat("unexpected keyword argument '", key, "'"));
  }
}

py::list OptionDeclarations() {
  py::list out;
  const LoaderOptions defaults;
  defaults.ForEachOption([&](const OptionInfo& info, const auto& value) {
    out.append(py::make_tuple(info.name, GroupName(info.group), ToPython(value), info.doc));
  });
  return out;
}

const char* OptionsDocstring(const char* summary, std::initializer_list<OptionGroup> groups) {
  auto* doc = new std::string(summary);  // pybind11 keeps the pointer: never freed
  const LoaderOptions defaults;
  defaults.ForEachOption([&](const OptionInfo& info, const auto& value) {
    if (std::find(groups.begin(), groups.end(), info.group) == groups.end()) return;
    absl::StrAppend(doc, "\n  ", info.name, "=", std::string(py::str(py::repr(ToPython(value)))),
                    ": ", info.doc, ".");
  });
  return doc->c_str();
}

}  // namespace feedline::python
