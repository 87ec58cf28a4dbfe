// The data set seam's non-virtual parts (include/feedline/dataset.h).
#include "feedline/dataset.h"

#include "absl/strings/str_cat.h"

namespace feedline {

const std::vector<uint8_t>* Record::member(std::string_view name) const {
  for (const Member& m : members) {
    if (m.name == name) return &m.bytes;
  }
  return nullptr;
}

void Record::Clear() {
  bytes.clear();
  label = -1;
  for (Member& m : members) m.bytes.clear();
  members.clear();
  meta.reset();
}

std::string Dataset::Describe(int64_t index) const { return absl::StrCat("sample ", index); }

}  // namespace feedline
