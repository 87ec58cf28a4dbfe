// ValidateOptions (include/feedline/options.h): every option's range, from its declaration.
#include "feedline/options.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/env.h"

namespace feedline {

absl::Status InvalidOption(absl::string_view option, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(option, ": ", why));
}

absl::Status ValidateOptions(const LoaderOptions& options, OptionGroup group) {
  absl::Status status;
  options.ForEachOption([&](const OptionInfo& info, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
      if (!status.ok() || info.group != group) return;
      const double v = static_cast<double>(value);
      const OptionCheck& c = info.check;
      bool ok = true;
      std::string why;
      switch (c.kind) {
        case OptionCheck::kNone:
          return;
        case OptionCheck::kAtLeast:
          ok = v >= c.lo;  // false for NaN
          why = absl::StrCat("must be >= ", c.lo);
          break;
        case OptionCheck::kIn:
          ok = v >= c.lo && v <= c.hi;
          why = absl::StrCat("must be in [", c.lo, ", ", c.hi, "]");
          break;
        case OptionCheck::kAutoOrIn:
          ok = v == kAuto || (v >= c.lo && v <= c.hi);
          why = absl::StrCat("must be auto or in [", c.lo, ", ", c.hi, "]");
          break;
      }
      if (!ok) {
        status = InvalidOption(info.name, c.message != nullptr ? c.message : why);
      }
    }
  });
  return status;
}

std::vector<std::string> ChangedOptions(const LoaderOptions& options, OptionGroup group) {
  // The defaults' fields in declaration order: the i-th visited field of `options` has the
  // type of the i-th default.
  const LoaderOptions defaults;
  std::vector<const void*> default_fields;
  defaults.ForEachOption([&](const OptionInfo&, const auto& value) {
    default_fields.push_back(&value);
  });
  std::vector<std::string> changed;
  size_t i = 0;
  options.ForEachOption([&](const OptionInfo& info, const auto& value) {
    using T = std::decay_t<decltype(value)>;
    if (info.group == group && !(value == *static_cast<const T*>(default_fields[i]))) {
      changed.emplace_back(info.name);
    }
    ++i;
  });
  return changed;
}

absl::StatusOr<int> ResolvedWorkerNice(const LoaderOptions& options) {
  const std::string env = Env("FEEDLINE_WORKER_NICE");
  if (env.empty()) return options.worker_nice();
  int nice = 0;
  if (!absl::SimpleAtoi(env, &nice) || nice < 0 || nice > 19) {
    return InvalidOption("worker_nice",
                         absl::StrCat("FEEDLINE_WORKER_NICE=", env, " must be in [0, 19]"));
  }
  return nice;
}

}  // namespace feedline
