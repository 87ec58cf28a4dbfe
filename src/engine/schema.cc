#include "feedline/schema.h"

#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace feedline {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kUint8:
      return "uint8";
    case DType::kFloat32:
      return "float32";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kBytes:
      return "bytes";
    case DType::kFloat64:
      return "float64";
    case DType::kBool:
      return "bool";
    case DType::kInt8:
      return "int8";
    case DType::kInt16:
      return "int16";
  }
  return "?";
}

bool Field::variable() const noexcept {
  for (const Dim& d : shape_) {
    if (d.variable) return true;
  }
  return false;
}

int64_t Field::max_elements() const noexcept {
  int64_t n = 1;
  for (const Dim& d : shape_) n *= d.size;
  return n;
}

std::string Field::DebugString() const {
  std::vector<std::string> dims;
  for (const Dim& d : shape_) dims.push_back(absl::StrCat(d.variable ? "<=" : "", d.size));
  return absl::StrCat(name_, ": ", DTypeName(dtype_), " [", absl::StrJoin(dims, ", "), "]",
                      collate_ == Collate::kRagged ? " ragged" : "");
}

int Schema::Find(std::string_view name) const noexcept {
  for (size_t i = 0; i < fields_.size(); ++i) {
    if (fields_[i].name() == name) return int(i);
  }
  return -1;
}

absl::Status Schema::Validate() const {
  constexpr int kMaxFields = 64;  // SampleWriter keeps one bit per field
  constexpr int64_t kMaxSampleBytes = int64_t{1} << 30;
  if (fields_.empty()) return absl::InvalidArgumentError("schema: no fields");
  if (fields_.size() > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("schema: ", fields_.size(), " fields, more than ", kMaxFields));
  }
  std::set<std::string> names;
  for (const Field& f : fields_) {
    if (f.name().empty()) return absl::InvalidArgumentError("schema: a field without a name");
    if (!names.insert(f.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("schema: field '", f.name(), "' twice"));
    }
    for (const Dim& d : f.shape()) {
      if (d.size < 1 || d.size > kMaxSampleBytes) {
        return absl::InvalidArgumentError(absl::StrCat(
            "schema: field ", f.DebugString(), ": every dimension (or maximum) must be >= 1"));
      }
    }
    double bytes = ElementSize(f.dtype());  // in double: a product of int64s could overflow
    for (const Dim& d : f.shape()) bytes *= double(d.size);
    if (bytes > double(kMaxSampleBytes)) {
      return absl::InvalidArgumentError(
          absl::StrCat("schema: field ", f.DebugString(), ": a sample above 1 GiB"));
    }
    if (f.collate() == Collate::kRagged && !f.variable()) {
      return absl::InvalidArgumentError(
          absl::StrCat("schema: field ", f.DebugString(), ": ragged needs a variable dimension"));
    }
  }
  return absl::OkStatus();
}

std::string Schema::DebugString() const {
  std::vector<std::string> parts;
  for (const Field& f : fields_) parts.push_back(f.DebugString());
  return absl::StrJoin(parts, "; ");
}

}  // namespace feedline
