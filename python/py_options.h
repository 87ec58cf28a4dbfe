// Loader options to and from Python, from their declarations (include/feedline/options.h:
// FEEDLINE_ARG + ForEachOption): a binding's keyword arguments are the declared names with the
// declared types and defaults, never listed or restated here.
#ifndef FEEDLINE_PYTHON_PY_OPTIONS_H_
#define FEEDLINE_PYTHON_PY_OPTIONS_H_

#include <pybind11/pybind11.h>

#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "feedline/options.h"

namespace feedline::python {

// Sets the options of `groups` named in `kwargs` (their declared names), converted by their
// declared types (enums by the names of EnumNames). TypeError for a keyword that is not an
// option of those groups, or a value of the wrong type; ValueError for an unknown enum name.
// Both name the option.
void SetOptions(const pybind11::dict& kwargs, std::initializer_list<OptionGroup> groups,
                LoaderOptions* options);

// Every declared option, in declaration order: a list of (name, group, default) with the group
// "engine" or "image" and the default as Python sees it (enums by name, pairs and triples as
// tuples).
pybind11::list OptionDeclarations();
// The keyword arguments of `groups`, one line each ("name=default: doc."), for a binding's
// docstring (kept for the module's life).
const char* OptionsDocstring(const char* summary, std::initializer_list<OptionGroup> groups);

// An enum by the names of EnumNames<E> (one parser for every enum the bindings take: the
// options' and the built-ins' own): TypeError when `v` is not a str, ValueError naming `option`
// and the choices when it is no name of E.
template <typename E>
std::string EnumChoices() {
  std::string names;
  for (const auto& [name, value] : EnumNames<E>::kValues) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", "'", name, "'");
  }
  return names;
}
template <typename E>
E EnumFromPython(const char* option, pybind11::handle v) {
  if (!pybind11::isinstance<pybind11::str>(v)) {
    throw pybind11::type_error(absl::StrCat(option, ": expected one of ", EnumChoices<E>(),
                                            ", got ", Py_TYPE(v.ptr())->tp_name));
  }
  const std::string s = v.cast<std::string>();
  for (const auto& [name, value] : EnumNames<E>::kValues) {
    if (s == name) return value;
  }
  throw pybind11::value_error(
      absl::StrCat(option, ": expected one of ", EnumChoices<E>(), ", got '", s, "'"));
}
// The name of `e` in EnumNames<E> ("?" for a value without one).
template <typename E>
const char* EnumName(E e) {
  for (const auto& [name, value] : EnumNames<E>::kValues) {
    if (value == e) return name;
  }
  return "?";
}

}  // namespace feedline::python

#endif  // FEEDLINE_PYTHON_PY_OPTIONS_H_
