// libFuzzer target: brace expansion of shard patterns (ExpandBraces), which takes what a user
// or a remote list file names. Properties: no crash; the names made stay within
// kMaxExpandedNames and kMaxExpandedBytes (two ranges of 3,000 once made 9M names, 3.7 GB);
// a pattern without '{' is itself; every name made has no brace range left, keeps the text
// before the first brace and after the last one, and the count is the product of the ranges.
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "fuzz_util.h"
#include "io/tar_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size > 4096) return 0;
  const std::string pattern(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<std::vector<std::string>> names = feedline::ExpandBraces(pattern);
  if (!names.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(names.status()), names.status().ToString());
    FUZZ_CHECK(pattern.find('{') != std::string::npos, "an error without a brace");
    return 0;
  }
  FUZZ_CHECK(!names->empty(), pattern);
  FUZZ_CHECK(int64_t(names->size()) <= feedline::kMaxExpandedNames, pattern);
  int64_t bytes = 0;
  for (const std::string& n : *names) bytes += int64_t(n.size());
  FUZZ_CHECK(bytes <= feedline::kMaxExpandedBytes, pattern);
  const size_t open = pattern.find('{');
  if (open == std::string::npos) {
    FUZZ_CHECK(names->size() == 1 && (*names)[0] == pattern, pattern);
    return 0;
  }
  const size_t close = pattern.rfind('}');
  const std::string head = pattern.substr(0, open), tail = pattern.substr(close + 1);
  for (const std::string& n : *names) {
    FUZZ_CHECK(absl::StartsWith(n, head) && absl::EndsWith(n, tail), n);
  }
  // The count is the product of every range's size (each range: its own zero-padded numbers).
  int64_t product = 1;
  std::string rest = pattern;
  for (size_t o = rest.find('{'); o != std::string::npos; o = rest.find('{')) {
    const size_t c = rest.find('}', o), d = rest.find("..", o);
    FUZZ_CHECK(c != std::string::npos && d != std::string::npos && d < c, pattern);
    int64_t a = 0, b = 0;
    FUZZ_CHECK(absl::SimpleAtoi(rest.substr(o + 1, d - o - 1), &a) &&
                   absl::SimpleAtoi(rest.substr(d + 2, c - d - 2), &b) && b >= a,
               pattern);
    product *= b - a + 1;
    FUZZ_CHECK(product <= feedline::kMaxExpandedNames, pattern);
    rest = rest.substr(c + 1);
  }
  FUZZ_CHECK(int64_t(names->size()) == product,
             absl::StrCat(pattern, ": ", names->size(), " names, ranges give ", product));
  return 0;
}
