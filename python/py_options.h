// Loader options to and from Python, from their declarations (include/feedline/options.h:
// FEEDLINE_ARG + ForEachOption): a binding's keyword arguments are the declared names with the
// declared types and defaults, never listed or restated here.
#ifndef FEEDLINE_PYTHON_PY_OPTIONS_H_
#define FEEDLINE_PYTHON_PY_OPTIONS_H_

#include <pybind11/pybind11.h>

#include <initializer_list>

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

}  // namespace feedline::python

#endif  // FEEDLINE_PYTHON_PY_OPTIONS_H_
