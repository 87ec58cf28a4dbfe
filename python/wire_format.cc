#include "wire_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

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
    // Within the declared bounds before any arithmetic: the product then fits (a schema's
    // largest sample is bounded when it is validated).
    int64_t elements = 1;
    for (size_t d = 0; d < shape.size(); ++d) {
      const Dim& bound = field.shape()[d];
      if (shape[d] < 0 || shape[d] > bound.size || (!bound.variable && shape[d] != bound.size)) {
        return absl::DataLossError(absl::StrCat("dimension ", d, " of field '", field.name(),
                                                "' is ", shape[d], " in the reply (",
                                                bound.variable ? "at most " : "", bound.size,
                                                ")"));
      }
      elements *= shape[d];
    }
    const size_t bytes = size_t(elements) * size_t(ElementSize(field.dtype()));
    if (n - off < bytes) return absl::DataLossError("truncated reply");
    absl::Status st = out.Write(f, shape, p + off);
    if (!st.ok()) return st;
    off += std::min(n - off, (bytes + 7) / 8 * 8);
  }
  return absl::OkStatus();
}

}  // namespace feedline::python
