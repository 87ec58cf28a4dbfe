#include "wire_format.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/status/statusor.h"
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

absl::Status ReadChunkTable(const uint8_t* p, size_t n, int64_t asked,
                            std::vector<ChunkEntry>* out) {
  out->clear();
  int64_t count = 0;
  if (n < 8) return absl::DataLossError("a chunk reply without its table");
  std::memcpy(&count, p, 8);
  if (count < 1 || count > asked) {
    return absl::DataLossError(
        absl::StrCat("a chunk reply of ", count, " samples (", asked, " asked for)"));
  }
  const size_t table = 8 + 24 * size_t(count);
  if (n < table) return absl::DataLossError("a chunk reply shorter than its table");
  for (int64_t j = 0; j < count; ++j) {
    int64_t e[3];
    std::memcpy(e, p + 8 + 24 * size_t(j), sizeof e);
    if ((e[0] != 0 && e[0] != 1) || e[1] < int64_t(table) || e[2] < 0 || uint64_t(e[1]) > n ||
        uint64_t(e[2]) > n - uint64_t(e[1])) {
      return absl::DataLossError(absl::StrCat("a chunk reply's sample ", j, " (status ", e[0], ", ",
                                              e[2], " bytes at ", e[1], " of ", n, ")"));
    }
    out->push_back(ChunkEntry{e[0], size_t(e[1]), size_t(e[2])});
  }
  return absl::OkStatus();
}

}  // namespace feedline::python
