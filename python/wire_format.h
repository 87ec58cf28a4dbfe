// The sample a worker process sends back (python/py_dataset.h: wire format), read into a batch
// slot. Kept apart from the pybind code so that a fuzz target reads it as the engine does
// (tests/fuzz/fuzz_wire.cc): a reply is bytes from another process, which user code runs in.
#ifndef FEEDLINE_PYTHON_WIRE_FORMAT_H_
#define FEEDLINE_PYTHON_WIRE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "feedline/schema.h"
#include "feedline/transform.h"

namespace feedline::python {

// Writes the sample in `p[0, n)` into `out`: for each field of `schema` in order, its shape
// (one little-endian int64 word per dimension) then its elements, padded to 8 bytes. Every word
// is checked before it is used: a shape that does not fit the field (SampleWriter::Shaped:
// kInvalidArgument naming it) and a payload shorter than the shapes say (kDataLoss, "truncated
// reply"); nothing is read past `n`.
absl::Status ReadSampleReply(const Schema& schema, const uint8_t* p, size_t n, SampleWriter& out);

// A chunk reply (status 2: the samples of a request for several positions, each its own reply)
// in `p[0, n)`: [count, (status, offset, size) x count] (little-endian int64 words), then each
// sample's payload at its offset. Checked before use: 1 <= count <= `asked`, each status 0 or
// 1, each [offset, offset + size) after the table and within `n` (kDataLoss otherwise, naming
// what is wrong). The entries go to `out`.
struct ChunkEntry {
  int64_t status = 0;
  size_t offset = 0;
  size_t size = 0;
};
absl::Status ReadChunkTable(const uint8_t* p, size_t n, int64_t asked,
                            std::vector<ChunkEntry>* out);

}  // namespace feedline::python

#endif  // FEEDLINE_PYTHON_WIRE_FORMAT_H_
