// feedline — what a sample is: a Schema of named, typed fields.
//
// A sample is a record of fields. Each `Field` has a name, an element type and a shape whose
// dimensions are fixed or variable (up to a declared maximum). The schema is the contract between
// a `SampleTransform` (which writes each sample's fields), the batch slot (whose memory is sized
// from it) and the consumer (which reads one column per field):
//
//   feedline::Schema schema({
//       feedline::Field("image", feedline::DType::kUint8, {3, 224, 224}),
//       feedline::Field("tokens", feedline::DType::kInt32, {feedline::Dim::UpTo(512)})
//           .pad_value(0),
//       feedline::Field("label", feedline::DType::kInt64, {}),
//   });
//
// In a batch, a fixed-shape field is one dense tensor [B, ...] written in place. A field with
// variable dimensions is either padded (default: [B, longest of the batch per dimension ...],
// filled with `pad_value`, with each sample's shape beside it) or ragged (`Collate::kRagged`:
// the samples' elements back to back, with offsets [B + 1]).
//
// Thread safety: plain value types.
#ifndef FEEDLINE_SCHEMA_H_
#define FEEDLINE_SCHEMA_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace feedline {

// Element types. Image outputs use the first four (float types normalised there); kBytes is raw
// bytes (uint8 elements, usually one variable dimension: a blob per sample). The last four are
// the rest of what torch's default_collate makes from Python samples (float -> float64,
// bool -> bool) and what numpy arrays and tensors hold.
enum class DType {
  kUint8,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kBytes,
  kFloat64,
  kBool,  // one byte, 0 or 1
  kInt8,
  kInt16,
};
inline constexpr int ElementSize(DType t) {
  switch (t) {
    case DType::kUint8:
    case DType::kBytes:
    case DType::kBool:
    case DType::kInt8:
      return 1;
    case DType::kFloat16:
    case DType::kBFloat16:
    case DType::kInt16:
      return 2;
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kInt64:
    case DType::kFloat64:
      return 8;
  }
  return 1;
}
const char* DTypeName(DType t);  // "uint8", "float32", ...

// One dimension of a field's shape: a fixed size, or variable up to a maximum.
struct Dim {
  int64_t size = 0;  // the size; for a variable dimension its maximum
  bool variable = false;
  constexpr Dim(int64_t n) : size(n) {}  // NOLINT: a plain number is a fixed dimension
  static constexpr Dim UpTo(int64_t max) {
    Dim d(max);
    d.variable = true;
    return d;
  }
};

enum class Collate {
  kPad,     // [B, longest per variable dimension ...], pad_value beyond each sample's shape
  kRagged,  // values back to back ([total elements]), offsets[B + 1] in elements
};

class Field {
 public:
  Field(std::string name, DType dtype, std::vector<Dim> shape)
      : name_(std::move(name)), dtype_(dtype), shape_(std::move(shape)) {}
  Field(std::string name, DType dtype, std::initializer_list<Dim> shape)
      : name_(std::move(name)), dtype_(dtype), shape_(shape) {}

  Field& pad_value(double v) & {
    pad_value_ = v;
    return *this;
  }
  Field&& pad_value(double v) && { return std::move(pad_value(v)); }
  Field& collate(Collate c) & {
    collate_ = c;
    return *this;
  }
  Field&& collate(Collate c) && { return std::move(collate(c)); }

  const std::string& name() const noexcept { return name_; }
  DType dtype() const noexcept { return dtype_; }
  const std::vector<Dim>& shape() const noexcept { return shape_; }
  int rank() const noexcept { return int(shape_.size()); }
  double pad_value() const noexcept { return pad_value_; }
  Collate collate() const noexcept { return collate_; }
  bool variable() const noexcept;
  // Elements and bytes of the largest sample the field admits (the product of the sizes).
  int64_t max_elements() const noexcept;
  int64_t max_bytes() const noexcept { return max_elements() * ElementSize(dtype_); }
  // "tokens: int32 [<=512]"
  std::string DebugString() const;

 private:
  std::string name_;
  DType dtype_;
  std::vector<Dim> shape_;
  double pad_value_ = 0;
  Collate collate_ = Collate::kPad;
};

class Schema {
 public:
  Schema() = default;
  explicit Schema(std::vector<Field> fields) : fields_(std::move(fields)) {}
  Schema(std::initializer_list<Field> fields) : fields_(fields) {}

  const std::vector<Field>& fields() const noexcept { return fields_; }
  int size() const noexcept { return int(fields_.size()); }
  const Field& field(int i) const { return fields_[size_t(i)]; }
  // The field's position, or -1.
  int Find(std::string_view name) const noexcept;
  // kInvalidArgument naming the field: no fields, an empty or repeated name, a size < 1, a
  // sample above 1 GiB, a ragged field without variable dimensions.
  absl::Status Validate() const;
  std::string DebugString() const;

 private:
  std::vector<Field> fields_;
};

}  // namespace feedline

#endif  // FEEDLINE_SCHEMA_H_
