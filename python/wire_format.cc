#include "wire_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"

namespace feedline::python {

absl::Status ReadSampleReply(const Schema& schema, const uint8_t* p, size_t n,
                             SampleWriter& out) {
  size_t off = 0;
  std::vector<int64_t> shape;
  for (int f = 0; f < schema.size(); ++f) {
    const Field& field = schema.field(f);
    shape.resize(size_t(field.rank()));
    if (n - off < 8 * shape.size()) return absl::DataLossError("truncated reply");
    std::memcpy(shape.data(), p + off, 8 * shape.size());
    off += 8 * shape.size();
    // The slot checks the shape against the field's bounds before any arithmetic: the product
    // then fits (a schema's largest sample is bounded when it is validated).
    absl::StatusOr<void*> dst = out.Shaped(f, shape);
    if (!dst.ok()) return dst.status();
    int64_t elements = 1;
    for (int64_t d : shape) elements *= d;
    const size_t bytes = size_t(elements) * size_t(ElementSize(field.dtype()));
    if (n - off < bytes) return absl::DataLossError("truncated reply");
    std::memcpy(*dst, p + off, bytes);
    off += std::min(n - off, (bytes + 7) / 8 * 8);
  }
  return absl::OkStatus();
}

}  // namespace feedline::python
