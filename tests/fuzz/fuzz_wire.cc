// libFuzzer target: the sample reply of a feedline.DataLoader worker process
// (python/wire_format.h: ReadSampleReply), read into a real batch slot as the process executor
// reads it. The reply is bytes another process wrote, running user code: a bug or a lie there
// must be an error of that sample, never an overrun, an overflow or a write past the slot.
// The schema has a fixed, a padded 2-d and a ragged field (python/py_dataset.h's kinds), the
// sample position and the schema's bounds come from a hash of the input. Properties: no crash;
// a refused reply is kDataLoss or kInvalidArgument; an accepted one wrote every field within its
// bounds, and its fixed field holds the reply's bytes. A third of the inputs are read as a chunk
// reply (ReadChunkTable): a table refused as kDataLoss, or entries within the reply, each
// sample of which is read as above.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/batch_slot.h"
#include "feedline/schema.h"
#include "feedline/transform.h"
#include "fuzz_util.h"
#include "wire_format.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using feedline::Dim;
  using feedline::DType;
  using feedline::Field;
  if (size > 65536) return 0;
  feedline::fuzz::InputHash h(data, size);
  constexpr int64_t kBatch = 4;
  // One layout and slot per bound, made once (a slot's arena is a 2 MiB-aligned allocation).
  struct Target {
    feedline::Schema schema;
    std::shared_ptr<const feedline::internal::SlotLayout> layout;
    std::unique_ptr<feedline::internal::BatchSlot> slot;
  };
  static Target* targets = [] {
    auto* t = new Target[5];
    for (int64_t rows = 1; rows <= 5; ++rows) {
      Target& x = t[rows - 1];
      x.schema = feedline::Schema(
          {Field("fixed", DType::kUint8, {3}),
           Field("padded", DType::kFloat32, {Dim::UpTo(rows), Dim::UpTo(4)}),
           Field("ragged", DType::kInt64, {Dim::UpTo(16)}).collate(feedline::Collate::kRagged)});
      FUZZ_CHECK(x.schema.Validate().ok(), "");
      x.layout = std::make_shared<const feedline::internal::SlotLayout>(
          feedline::internal::SlotLayout::Make(x.schema, kBatch));
      x.slot = std::make_unique<feedline::internal::BatchSlot>(feedline::DefaultHostAllocator(),
                                                               x.layout);
    }
    return t;
  }();
  Target& target = targets[h.Next() % 5];
  const feedline::Schema& schema = target.schema;
  const auto& layout = target.layout;
  feedline::internal::BatchSlot& slot = *target.slot;
  const int64_t pos = int64_t(h.Next() % kBatch);
  // The reply in a buffer of its own size, so that a read past it is ASan's.
  std::vector<uint8_t> reply(data, data + size);
  if (h.Next() % 3 == 0) {  // read as a chunk reply: its table, then each sample it holds
    const int64_t asked = 1 + int64_t(h.Next() % 64);
    std::vector<feedline::python::ChunkEntry> entries;
    const absl::Status st =
        feedline::python::ReadChunkTable(reply.data(), reply.size(), asked, &entries);
    if (!st.ok()) {
      FUZZ_CHECK(absl::IsDataLoss(st), st.ToString());
      return 0;
    }
    FUZZ_CHECK(!entries.empty() && int64_t(entries.size()) <= asked, "");
    const size_t table = 8 + 24 * entries.size();
    for (const feedline::python::ChunkEntry& e : entries) {
      FUZZ_CHECK(e.status == 0 || e.status == 1, "");
      FUZZ_CHECK(e.offset >= table && e.offset <= size && e.size <= size - e.offset, "");
      if (e.status != 0) continue;
      // Each sample from its own copy, so that a read past its entry is ASan's too.
      std::vector<uint8_t> sample(reply.begin() + ptrdiff_t(e.offset),
                                  reply.begin() + ptrdiff_t(e.offset + e.size));
      feedline::SampleWriter w = layout->Writer(&slot, pos);
      const absl::Status s =
          feedline::python::ReadSampleReply(schema, sample.data(), sample.size(), w);
      FUZZ_CHECK(s.ok() || absl::IsDataLoss(s) || absl::IsInvalidArgument(s), s.ToString());
    }
    return 0;
  }
  feedline::SampleWriter writer = layout->Writer(&slot, pos);
  const absl::Status st =
      feedline::python::ReadSampleReply(schema, reply.data(), reply.size(), writer);
  if (!st.ok()) {
    FUZZ_CHECK(absl::IsDataLoss(st) || absl::IsInvalidArgument(st), st.ToString());
    return 0;
  }
  // Accepted: every field written, within its bounds; the fixed field is the reply's 3 bytes.
  FUZZ_CHECK(feedline::internal::SlotLayout::CheckWritten(writer).ok(), "");
  FUZZ_CHECK(size >= 8 + 3, "a fixed field's shape and bytes");
  int64_t dim = 0;
  std::memcpy(&dim, data, 8);
  FUZZ_CHECK(dim == 3, std::to_string(dim));
  FUZZ_CHECK(std::memcmp(slot.field_data(0) + size_t(pos) * 3, data + 8, 3) == 0, "");
  for (int f = 1; f < schema.size(); ++f) {
    const int64_t* shape = slot.sample_shape(f, pos);
    for (int d = 0; d < schema.field(f).rank(); ++d) {
      FUZZ_CHECK(shape[d] >= 0 && shape[d] <= schema.field(f).shape()[size_t(d)].size,
                 std::to_string(shape[d]));
    }
  }
  return 0;
}
