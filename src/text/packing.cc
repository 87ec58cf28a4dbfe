// Sequence packing (feedline/text.h): rows of seq_len tokens from a document loader's ragged
// batches, built on the consumer's thread, with a cursor (document position and offset, or
// window and row) as the whole resume state.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "feedline/random.h"
#include "feedline/schema.h"
#include "feedline/text.h"

namespace feedline::text {
namespace {

constexpr int64_t kIgnoreLabel = -100;                // torch's cross-entropy ignore_index
constexpr uint64_t kRngPackRows = uint64_t{1} << 31;  // kBestFit's row order (a library stream)

enum PackedField { kInputIds, kLabels, kPositionIds, kAttentionMask, kCuSeqlens };

// One document of the epoch's stream.
struct Doc {
  std::vector<int64_t> tokens;
  int64_t position = -1;  // in this rank's epoch order
  int64_t index = -1;     // the data set's
  int64_t start = 0;      // tokens a rank of a saved layout had packed (Holes)
};

// After a resume on another world size (PackedLoader::Resplit): what the saved layout's ranks
// had packed, found from their cursors. This rank's position p is the epoch's position
// `first + p * stride` after the saved layout's base, which the saved layout had given to its
// rank g % world as that rank's position g / world.
struct Holes {
  int64_t world = 0;  // the saved layout's world size; 0: no holes
  std::vector<PackedLoader::Cursor> cursors;
  int64_t first = 0, stride = 1;
  // -1: packed before the resume; else the tokens of the document to start at.
  int64_t StartOf(int64_t position) const {
    if (world == 0) return 0;
    const int64_t g = first + position * stride;
    const PackedLoader::Cursor& c = cursors[size_t(g % world)];
    const int64_t j = g / world;
    return j < c.document ? -1 : j == c.document ? c.offset : 0;
  }
};

// A run of one document's tokens in a row.
struct Segment {
  int64_t start = 0, len = 0;
  bool doc_end = false;  // the document's last token is the segment's
};

struct Row {
  std::vector<int64_t> ids;  // the real tokens (padding is added when written)
  std::vector<Segment> segments;
  std::vector<int64_t> labels;  // ids.size() entries, set once the row is complete
  int64_t first_doc = -1;
};

// The documents of one epoch, in order, one at a time out of the document loader's batches.
class DocStream {
 public:
  DocStream(std::unique_ptr<Epoch> epoch, int64_t docs_per_batch, int64_t skip_before,
            std::atomic<int64_t>* empty, Holes holes)
      : epoch_(std::move(epoch)),
        per_batch_(docs_per_batch),
        skip_before_(skip_before),
        empty_(empty),
        holes_(std::move(holes)) {}

  // True and the next document; false at the end of the epoch; a document batch's error (the
  // batch is then gone: the next call goes on with the next one). A document without tokens
  // (a line of no-break spaces, zero-width characters or control characters tokenizes to none)
  // is skipped and counted: no row ever holds an empty segment.
  absl::StatusOr<bool> Next(Doc* doc, const std::function<absl::Status()>& interrupted,
                            absl::Duration poll) {
    for (;;) {
      if (in_batch_ < batch_.size()) {
        const int64_t i = in_batch_++;
        const int64_t position = batch_.index() * per_batch_ + i;
        if (position < skip_before_) continue;
        const int64_t start = holes_.StartOf(position);
        if (start < 0) continue;  // packed by a rank of the saved layout
        const int64_t a = ids_.offsets[i], b = ids_.offsets[i + 1];
        if (b <= a) {
          empty_->fetch_add(1, std::memory_order_relaxed);
          continue;
        }
        doc->tokens.resize(size_t(b - a));
        if (ids_.dtype == DType::kInt32) {
          const int32_t* p = static_cast<const int32_t*>(ids_.data) + a;
          for (int64_t j = 0; j < b - a; ++j) doc->tokens[size_t(j)] = p[j];
        } else {
          std::memcpy(doc->tokens.data(), static_cast<const int64_t*>(ids_.data) + a,
                      size_t(b - a) * sizeof(int64_t));
        }
        doc->position = position;
        doc->index = batch_.indices()[i];
        doc->start = start;
        return true;
      }
      if (ended_) return false;
      absl::StatusOr<Batch> next = interrupted ? epoch_->Next(interrupted, poll) : epoch_->Next();
      if (!next.ok()) {
        if (absl::IsOutOfRange(next.status())) {
          ended_ = true;
          batch_ = Batch();
          in_batch_ = 0;
          return false;
        }
        return next.status();
      }
      batch_ = *std::move(next);
      ids_ = batch_.field("input_ids");
      in_batch_ = 0;
    }
  }
  void Cancel() { epoch_->Cancel(); }

 private:
  std::unique_ptr<Epoch> epoch_;
  const int64_t per_batch_;
  const int64_t skip_before_;
  std::atomic<int64_t>* const empty_;
  const Holes holes_;
  Batch batch_;
  TensorView ids_;
  int64_t in_batch_ = 0;
  bool ended_ = false;
};

// Labels of a row whose tokens are one document's runs: the next token within a segment,
// -100 at a segment's end when `mask_end` says so for it (else the next segment's first token,
// or `after` for the row's last token).
void SetLabels(Row* row, bool mask_doc_ends, int64_t after) {
  const int64_t n = int64_t(row->ids.size());
  row->labels.resize(size_t(n));
  for (int64_t t = 0; t + 1 < n; ++t) row->labels[size_t(t)] = row->ids[size_t(t + 1)];
  if (n > 0) row->labels[size_t(n - 1)] = after;
  for (const Segment& s : row->segments) {
    if (s.doc_end && mask_doc_ends) row->labels[size_t(s.start + s.len - 1)] = kIgnoreLabel;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------

struct PackedLoader::Shared {
  std::unique_ptr<Loader> documents;
  PackOptions o;
  int64_t docs_per_batch = 1;
  std::unique_ptr<BatchBuilder> builder;

  std::atomic<int64_t> rows{0}, tokens{0}, slots{0}, docs{0}, truncated{0}, split{0}, empty{0},
      padding_rows{0};

  // The cursor of the epoch in progress (after its last batch), for state().
  mutable std::mutex mu;
  int64_t run_id = 0;
  bool active = false, finished = false;
  int64_t epoch = 0, batches_done = 0, document = 0, offset = 0;
  // The epoch in progress's holes (a resplit resume's: State::holes_*), for state().
  int64_t holes_world = 0, holes_base = 0;
  std::vector<PackedLoader::Cursor> holes;
  // Its documents' positions skipped before a resume on another layout (the document loader's
  // own state may already be past the epoch: its last batch is read ahead of the packer).
  int64_t skipped = 0;
  // What LoadState left for the next StartEpoch (when it starts that epoch).
  bool has_resume = false;
  State resume;
};

struct PackedEpoch::Run {
  std::shared_ptr<PackedLoader::Shared> sh;
  int64_t run_id = 0;
  int64_t epoch = 0;
  DocStream docs;
  int64_t batches_done = 0;
  int64_t padding_batches = 0;  // PaddingBatch(): after the rows, not in the resume state
  bool done = false;
  bool stream_end = false;
  absl::Status fatal;  // the epoch cannot go on (a resume position that does not fit the data)
  std::vector<Row> batch_rows;  // the batch in progress

  // kConcat
  Doc cur;
  bool has_cur = false;
  int64_t off = 0;          // tokens of `cur` already in rows
  int64_t resume_doc = -1;  // the first document's position and offset when resumed
  int64_t resume_off = 0;
  Row row;                // the row in progress
  bool row_full = false;  // its tokens are in; its last label waits for the next token

  // kBestFit
  int64_t window_first = 0;  // position of the window's first document
  int64_t next_first = 0;    // and of the document after its last
  int64_t window_tokens = 0;
  std::vector<Doc> window_docs;
  std::vector<Row> window_rows;
  size_t window_next = 0;
  int64_t window_skip = 0;  // rows of the first window already yielded (resume)

  Run(std::shared_ptr<PackedLoader::Shared> s, int64_t id, int64_t e, std::unique_ptr<Epoch> inner,
      int64_t skip_before, Holes holes)
      : sh(std::move(s)),
        run_id(id),
        epoch(e),
        docs(std::move(inner), sh->docs_per_batch, skip_before, &sh->empty, std::move(holes)) {}

  using Interrupt = std::function<absl::Status()>;

  // A saved layout's rank was `offset` tokens into document `position` (of this rank's order),
  // which has fewer now: the data or the tokenizer changed since.
  absl::Status Changed(int64_t position, int64_t offset) {
    has_cur = false;
    fatal = absl::FailedPreconditionError(absl::StrCat(
        "load_state_dict: a saved rank's position is token ", offset, " of document ", position,
        " of this rank's epoch, which has fewer tokens now (the data or the tokenizer changed "
        "since the state was saved)"));
    docs.Cancel();
    return fatal;
  }

  // kConcat: fills `row` (kept across calls that fail); OK with row.ids empty at the end.
  absl::Status NextConcatRow(const Interrupt& in, absl::Duration poll) {
    const int64_t L = sh->o.seq_len;
    while (!row_full && int64_t(row.ids.size()) < L) {
      if (!has_cur || off == int64_t(cur.tokens.size())) {
        absl::StatusOr<bool> got = docs.Next(&cur, in, poll);
        if (!got.ok()) return got.status();
        if (!*got) {
          stream_end = true;
          has_cur = false;
          break;
        }
        has_cur = true;
        off = cur.start;
        if (off > 0 && off >= int64_t(cur.tokens.size())) return Changed(cur.position, off);
        if (resume_off > 0 && cur.position >= resume_doc) {
          // The saved offset must lie inside the document it points into: a state saved before
          // the tokenizer or the data changed (same fingerprint, other token counts) is refused.
          const int64_t have = cur.position == resume_doc ? int64_t(cur.tokens.size()) : 0;
          if (resume_off >= have) {
            has_cur = false;
            fatal = absl::FailedPreconditionError(absl::StrCat(
                "load_state_dict: the saved position is token ", resume_off, " of document ",
                resume_doc, " of the epoch, which has ", have,
                " tokens now (the data or the tokenizer changed since the state was saved)"));
            docs.Cancel();
            return fatal;
          }
          off = resume_off;
          resume_off = 0;
        }
        sh->docs.fetch_add(1, std::memory_order_relaxed);
      }
      const int64_t k = std::min<int64_t>(L - int64_t(row.ids.size()), cur.tokens.size() - off);
      if (k <= 0) return absl::InternalError("packing: an empty segment");
      if (row.first_doc < 0) row.first_doc = cur.index;
      Segment s;
      s.start = int64_t(row.ids.size());
      s.len = k;
      s.doc_end = off + k == int64_t(cur.tokens.size());
      row.segments.push_back(s);
      row.ids.insert(row.ids.end(), cur.tokens.begin() + off, cur.tokens.begin() + off + k);
      off += k;
    }
    if (row.ids.empty()) return absl::OkStatus();
    row_full = true;
    // The row's last label: the document's next token, or at its end the next document's
    // first (when boundaries are not masked).
    int64_t after = kIgnoreLabel;
    const Segment& last = row.segments.back();
    if (!last.doc_end) {
      after = cur.tokens[size_t(off)];
    } else if (!sh->o.mask_boundaries && !stream_end) {
      absl::StatusOr<bool> got = docs.Next(&cur, in, poll);
      if (!got.ok()) return got.status();  // the row waits, complete, for the next call
      if (*got) {
        has_cur = true;
        off = cur.start;
        if (off > 0 && off >= int64_t(cur.tokens.size())) return Changed(cur.position, off);
        sh->docs.fetch_add(1, std::memory_order_relaxed);
        after = cur.tokens[size_t(off)];
      } else {
        stream_end = true;
        has_cur = false;
      }
    }
    SetLabels(&row, sh->o.mask_boundaries, after);
    return absl::OkStatus();
  }

  // kBucket: the window's documents sorted by length, cut into batches, the batches shuffled.
  void BucketWindow() {
    const int64_t L = sh->o.seq_len, B = sh->o.batch_size;
    std::vector<size_t> order(window_docs.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), [this](size_t a, size_t b) {
      return window_docs[a].tokens.size() < window_docs[b].tokens.size();
    });
    const size_t groups = (order.size() + size_t(B) - 1) / size_t(B);
    std::vector<size_t> group_order(groups);
    std::iota(group_order.begin(), group_order.end(), size_t{0});
    // The short group (a window that is not a multiple of B: the epoch's last) stays last.
    const size_t full = order.size() / size_t(B);
    if (sh->documents->options().shuffle() && full > 1) {
      SampleRng rng(sh->documents->options().seed(), uint64_t(epoch), uint64_t(window_first),
                    kRngPackRows);
      for (size_t i = full - 1; i > 0; --i) {
        std::swap(group_order[i], group_order[size_t(rng.Below(i + 1))]);
      }
    }
    window_rows.clear();
    for (size_t g : group_order) {
      for (size_t k = g * size_t(B); k < std::min(order.size(), (g + 1) * size_t(B)); ++k) {
        Doc& d = window_docs[order[k]];
        Row row;
        const int64_t n = std::min<int64_t>(int64_t(d.tokens.size()), L);
        if (n < int64_t(d.tokens.size())) sh->truncated.fetch_add(1, std::memory_order_relaxed);
        row.ids.assign(d.tokens.begin(), d.tokens.begin() + n);
        row.first_doc = d.index;
        window_rows.push_back(std::move(row));
      }
    }
    window_docs.clear();
  }

  // kBestFit: the window's documents into rows.
  void PackWindow() {
    const int64_t L = sh->o.seq_len;
    struct Piece {
      const Doc* doc;
      int64_t from, len;
    };
    std::vector<Piece> pieces;
    for (const Doc& d : window_docs) {
      const int64_t n = int64_t(d.tokens.size());
      if (n <= L) {
        pieces.push_back({&d, 0, n});
      } else if (sh->o.split_long) {
        sh->split.fetch_add(1, std::memory_order_relaxed);
        for (int64_t a = 0; a < n; a += L) pieces.push_back({&d, a, std::min(L, n - a)});
      } else {
        sh->truncated.fetch_add(1, std::memory_order_relaxed);
        pieces.push_back({&d, 0, L});
      }
    }
    // Best fit, longest first: each piece goes to the row it leaves the least room in.
    std::stable_sort(pieces.begin(), pieces.end(),
                     [](const Piece& a, const Piece& b) { return a.len > b.len; });
    window_rows.clear();
    std::multimap<int64_t, size_t> room;  // free tokens -> row
    for (const Piece& p : pieces) {
      auto it = room.lower_bound(p.len);
      size_t r;
      if (it == room.end()) {
        r = window_rows.size();
        window_rows.emplace_back();
        window_rows.back().first_doc = p.doc->index;
      } else {
        r = it->second;
        room.erase(it);
      }
      Row& row = window_rows[r];
      Segment s;
      s.start = int64_t(row.ids.size());
      s.len = p.len;
      s.doc_end = true;
      row.segments.push_back(s);
      row.ids.insert(row.ids.end(), p.doc->tokens.begin() + p.from,
                     p.doc->tokens.begin() + p.from + p.len);
      if (int64_t left = L - int64_t(row.ids.size()); left > 0) room.emplace(left, r);
    }
    for (Row& row : window_rows) SetLabels(&row, /*mask_doc_ends=*/true, kIgnoreLabel);
    // Rows in a shuffled order (else each window would start with its longest documents).
    if (sh->documents->options().shuffle() && window_rows.size() > 1) {
      SampleRng rng(sh->documents->options().seed(), uint64_t(epoch), uint64_t(window_first),
                    kRngPackRows);
      for (size_t i = window_rows.size() - 1; i > 0; --i) {
        std::swap(window_rows[i], window_rows[size_t(rng.Below(i + 1))]);
      }
    }
    window_docs.clear();
  }

  // kBestFit: the next row (false at the end of the epoch). A window is the documents, in the
  // epoch's order, that fill window_rows rows.
  absl::StatusOr<bool> NextFitRow(Row* out, const Interrupt& in, absl::Duration poll) {
    const bool bucket = sh->o.mode == PackMode::kBucket;
    const int64_t L = sh->o.seq_len;
    // kBucket counts documents, kBestFit tokens.
    const int64_t budget = sh->o.window_rows * (bucket ? sh->o.batch_size : L);
    while (window_next >= window_rows.size()) {
      if (!window_rows.empty()) {  // the window is done: on to the next
        window_rows.clear();
        window_next = 0;
        window_first = next_first;
      }
      while (!stream_end && window_tokens < budget) {
        Doc d;
        absl::StatusOr<bool> got = docs.Next(&d, in, poll);
        if (!got.ok()) return got.status();  // what was collected stays for the next call
        if (!*got) {
          stream_end = true;
          break;
        }
        if (window_docs.empty()) window_first = d.position;
        next_first = d.position + 1;
        const int64_t n = int64_t(d.tokens.size());
        window_tokens += bucket ? 1 : sh->o.split_long ? n : std::min(n, L);
        sh->docs.fetch_add(1, std::memory_order_relaxed);
        window_docs.push_back(std::move(d));
      }
      if (window_docs.empty()) return false;
      if (bucket) {
        BucketWindow();
      } else {
        PackWindow();
      }
      window_tokens = 0;
      window_next = size_t(std::min<int64_t>(window_skip, int64_t(window_rows.size())));
      window_skip = 0;
    }
    *out = std::move(window_rows[window_next++]);
    return true;
  }

  absl::StatusOr<Batch> Next(const Interrupt& in, absl::Duration poll) {
    if (!fatal.ok()) return fatal;
    if (done) return absl::OutOfRangeError("the epoch is over");
    const PackOptions& o = sh->o;
    while (int64_t(batch_rows.size()) < o.batch_size) {
      if (o.mode == PackMode::kConcat) {
        if (absl::Status s = NextConcatRow(in, poll); !s.ok()) return s;
        if (row.ids.empty()) break;
        batch_rows.push_back(std::move(row));
        row = Row();
        row_full = false;
      } else {
        Row r;
        absl::StatusOr<bool> got = NextFitRow(&r, in, poll);
        if (!got.ok()) return got.status();
        if (!*got) break;
        batch_rows.push_back(std::move(r));
      }
    }
    if (batch_rows.empty() || (o.drop_last && int64_t(batch_rows.size()) < o.batch_size)) {
      Finish();
      return absl::OutOfRangeError("the epoch is over");
    }
    absl::StatusOr<Batch> batch = Write();
    batch_rows.clear();
    if (!batch.ok()) return batch.status();
    ++batches_done;
    Publish();
    return batch;
  }

  absl::StatusOr<Batch> Write() {
    const int64_t L = sh->o.seq_len;
    const int64_t n = int64_t(batch_rows.size());
    BatchBuilder& b = *sh->builder;
    int64_t real = 0;
    if (sh->o.mode == PackMode::kBucket) {
      int64_t longest = 0;
      for (int64_t r = 0; r < n; ++r) {
        const Row& row = batch_rows[size_t(r)];
        absl::StatusOr<int64_t*> ids =
            b.Writer(r).Shaped<int64_t>(kInputIds, {int64_t(row.ids.size())});
        if (!ids.ok()) return ids.status();
        std::copy(row.ids.begin(), row.ids.end(), *ids);
        b.indices()[r] = row.first_doc;
        real += int64_t(row.ids.size());
        longest = std::max(longest, int64_t(row.ids.size()));
      }
      sh->rows.fetch_add(n, std::memory_order_relaxed);
      sh->tokens.fetch_add(real, std::memory_order_relaxed);
      sh->slots.fetch_add(n * longest, std::memory_order_relaxed);
      return b.Finish(n, batches_done, epoch);
    }
    for (int64_t r = 0; r < n; ++r) {
      const Row& row = batch_rows[size_t(r)];
      const int64_t len = int64_t(row.ids.size());
      real += len;
      SampleWriter& w = b.Writer(r);
      int64_t* ids = w.Fixed<int64_t>(kInputIds);
      int64_t* labels = w.Fixed<int64_t>(kLabels);
      int64_t* pos = w.Fixed<int64_t>(kPositionIds);
      int64_t* mask = w.Fixed<int64_t>(kAttentionMask);
      std::copy(row.ids.begin(), row.ids.end(), ids);
      std::fill(ids + len, ids + L, sh->o.pad_id);
      std::copy(row.labels.begin(), row.labels.end(), labels);
      std::fill(labels + len, labels + L, kIgnoreLabel);
      for (const Segment& s : row.segments) std::iota(pos + s.start, pos + s.start + s.len, 0);
      std::fill(pos + len, pos + L, 0);
      std::fill(mask, mask + len, 1);
      std::fill(mask + len, mask + L, 0);
      const int64_t entries =
          int64_t(row.segments.size()) + (len < L ? 1 : 0) + (r + 1 == n ? 1 : 0);
      absl::StatusOr<int32_t*> cu = w.Shaped<int32_t>(kCuSeqlens, {entries});
      if (!cu.ok()) return cu.status();
      int32_t* c = *cu;
      for (const Segment& s : row.segments) *c++ = int32_t(r * L + s.start);
      if (len < L) *c++ = int32_t(r * L + len);
      if (r + 1 == n) *c++ = int32_t(n * L);
      b.indices()[r] = row.first_doc;
    }
    sh->rows.fetch_add(n, std::memory_order_relaxed);
    sh->tokens.fetch_add(real, std::memory_order_relaxed);
    sh->slots.fetch_add(n * L, std::memory_order_relaxed);
    return b.Finish(n, batches_done, epoch);
  }

  absl::StatusOr<Batch> Padding() {
    if (sh->o.mode == PackMode::kBucket) {
      return absl::FailedPreconditionError(
          "PaddingBatch: bucketed batches are split as DistributedSampler splits them (equal "
          "batch counts on every rank); padding batches are for packed rows");
    }
    const int64_t L = sh->o.seq_len, n = sh->o.batch_size;
    BatchBuilder& b = *sh->builder;
    for (int64_t r = 0; r < n; ++r) {
      SampleWriter& w = b.Writer(r);
      std::fill_n(w.Fixed<int64_t>(kInputIds), L, sh->o.pad_id);
      std::fill_n(w.Fixed<int64_t>(kLabels), L, kIgnoreLabel);
      std::fill_n(w.Fixed<int64_t>(kPositionIds), L, int64_t{0});
      std::fill_n(w.Fixed<int64_t>(kAttentionMask), L, int64_t{0});
      absl::StatusOr<int32_t*> cu = w.Shaped<int32_t>(kCuSeqlens, {r + 1 == n ? 2 : 1});
      if (!cu.ok()) return cu.status();
      (*cu)[0] = int32_t(r * L);
      if (r + 1 == n) (*cu)[1] = int32_t(n * L);
      b.indices()[r] = -1;
    }
    absl::StatusOr<Batch> batch = b.Finish(n, batches_done + padding_batches, epoch);
    if (!batch.ok()) return batch.status();
    ++padding_batches;
    sh->padding_rows.fetch_add(n, std::memory_order_relaxed);
    sh->slots.fetch_add(n * L, std::memory_order_relaxed);
    return batch;
  }

  // The cursor after the last batch, for PackedLoader::state().
  void Publish() {
    int64_t document, offset;
    if (sh->o.mode == PackMode::kConcat) {
      if (has_cur && off < int64_t(cur.tokens.size())) {
        document = cur.position;
        offset = off;
      } else if (has_cur) {
        document = cur.position + 1;
        offset = 0;
      } else {
        document = stream_end ? sh->documents->num_samples() : std::max<int64_t>(resume_doc, 0);
        offset = stream_end ? 0 : resume_off;
      }
    } else if (window_next < window_rows.size()) {
      document = window_first;
      offset = int64_t(window_next);
    } else {
      document = window_rows.empty() ? window_first : next_first;
      offset = 0;
    }
    std::lock_guard<std::mutex> lock(sh->mu);
    if (sh->run_id != run_id) return;
    sh->batches_done = batches_done;
    sh->document = document;
    sh->offset = offset;
    sh->finished = document >= sh->documents->num_samples() && offset == 0;
  }

  void Finish() {
    done = true;
    std::lock_guard<std::mutex> lock(sh->mu);
    if (sh->run_id == run_id) sh->finished = true;
  }
};

PackedEpoch::PackedEpoch(std::unique_ptr<Run> run) : run_(std::move(run)) {}
PackedEpoch::~PackedEpoch() = default;

absl::StatusOr<Batch> PackedEpoch::Next() { return run_->Next(nullptr, absl::ZeroDuration()); }
absl::StatusOr<Batch> PackedEpoch::Next(const std::function<absl::Status()>& interrupted,
                                        absl::Duration poll) {
  return run_->Next(interrupted, poll);
}
absl::StatusOr<Batch> PackedEpoch::PaddingBatch() { return run_->Padding(); }
int64_t PackedEpoch::epoch() const noexcept { return run_->epoch; }
void PackedEpoch::Cancel() {
  run_->docs.Cancel();
  run_->done = true;
}

// ---------------------------------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<PackedLoader>> PackedLoader::Create(
    std::unique_ptr<Loader> documents, PackOptions o) {
  if (documents == nullptr) return absl::InvalidArgumentError("documents: a loader is required");
  const Schema& in = documents->schema();
  const int f = in.Find("input_ids");
  if (f < 0 || in.field(f).collate() != Collate::kRagged ||
      (in.field(f).dtype() != DType::kInt32 && in.field(f).dtype() != DType::kInt64)) {
    return absl::InvalidArgumentError(
        "documents: the loader's schema needs a ragged int32 or int64 \"input_ids\" field "
        "(MakeTokenizeTransform with ragged = true)");
  }
  if (o.seq_len < 1) return absl::InvalidArgumentError("seq_len: must be >= 1");
  if (o.batch_size < 1) return absl::InvalidArgumentError("batch_size: must be >= 1");
  if (o.window_rows < 1) return absl::InvalidArgumentError("window_rows: must be >= 1");
  if (o.seq_len * o.batch_size >= (int64_t{1} << 31)) {
    return absl::InvalidArgumentError("batch_size * seq_len: must be below 2^31 (cu_seqlens)");
  }
  auto sh = std::make_shared<Shared>();
  sh->docs_per_batch = documents->options().batch_size();
  if (documents->options().drop_last()) {
    return absl::InvalidArgumentError("documents: the loader must not drop_last");
  }
  const int64_t L = o.seq_len;
  const std::vector<Dim> row{Dim(L)};
  Schema schema =
      o.mode == PackMode::kBucket
          ? Schema({Field("input_ids", DType::kInt64, {Dim::UpTo(L)}).pad_value(double(o.pad_id))})
          : Schema(
                {Field("input_ids", DType::kInt64, row), Field("labels", DType::kInt64, row),
                 Field("position_ids", DType::kInt64, row),
                 Field("attention_mask", DType::kInt64, row),
                 Field("cu_seqlens", DType::kInt32, {Dim::UpTo(L + 1)}).collate(Collate::kRagged)});
  absl::StatusOr<std::unique_ptr<BatchBuilder>> builder =
      BatchBuilder::Create(std::move(schema), o.batch_size);
  if (!builder.ok()) return builder.status();
  sh->builder = *std::move(builder);
  sh->documents = std::move(documents);
  sh->o = o;
  return std::unique_ptr<PackedLoader>(new PackedLoader(std::move(sh)));
}

PackedLoader::PackedLoader(std::shared_ptr<Shared> shared) : shared_(std::move(shared)) {}
PackedLoader::~PackedLoader() = default;

std::unique_ptr<PackedEpoch> PackedLoader::StartEpoch() {
  Shared& sh = *shared_;
  const int64_t epoch = sh.documents->next_epoch();
  State resume;
  bool resuming = false;
  int64_t id;
  {
    std::lock_guard<std::mutex> lock(sh.mu);
    if (sh.has_resume && sh.resume.documents.epoch == epoch) {
      resume = sh.resume;
      resuming = true;
    }
    sh.has_resume = false;
    id = ++sh.run_id;
    sh.active = true;
    sh.finished = false;
    sh.epoch = epoch;
    sh.batches_done = resuming ? resume.batches_done : 0;
    sh.document = resuming ? resume.document : 0;
    sh.offset = resuming ? resume.offset : 0;
    sh.holes_world = resuming ? resume.holes_world : 0;
    sh.holes_base = resuming ? resume.holes_base : 0;
    sh.holes = resuming ? resume.holes : std::vector<Cursor>();
    sh.skipped = resuming ? resume.documents.skipped : 0;
  }
  Holes holes;
  if (resuming && resume.holes_world > 0) {
    // This rank's position p is the epoch's position skipped + rank + p * world_size (the
    // sampler deals what follows `skipped` round the ranks: even_shards is off for packing).
    const Loader::State here = sh.documents->state();
    holes.world = resume.holes_world;
    holes.cursors = resume.holes;
    holes.first = resume.documents.skipped - resume.holes_base + here.rank;
    holes.stride = here.world_size;
  }
  std::unique_ptr<Epoch> inner = sh.documents->StartEpoch();
  auto run = std::make_unique<PackedEpoch::Run>(shared_, id, epoch, std::move(inner),
                                                resuming ? resume.document : 0, std::move(holes));
  if (resuming) {
    run->batches_done = resume.batches_done;
    if (sh.o.mode == PackMode::kConcat) {
      run->resume_doc = resume.document;
      run->resume_off = resume.offset;
    } else {
      run->window_first = run->next_first = resume.document;
      run->window_skip = resume.offset;
    }
  }
  return std::unique_ptr<PackedEpoch>(new PackedEpoch(std::move(run)));
}

void PackedLoader::set_epoch(int64_t epoch) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->has_resume = false;
  }
  shared_->documents->set_epoch(epoch);
}
int64_t PackedLoader::next_epoch() const noexcept { return shared_->documents->next_epoch(); }
Loader& PackedLoader::documents() noexcept { return *shared_->documents; }
const Loader& PackedLoader::documents() const noexcept { return *shared_->documents; }
const PackOptions& PackedLoader::options() const noexcept { return shared_->o; }

PackStats PackedLoader::pack_stats() const {
  const Shared& sh = *shared_;
  PackStats s;
  s.rows = sh.rows.load(std::memory_order_relaxed);
  s.tokens = sh.tokens.load(std::memory_order_relaxed);
  s.documents = sh.docs.load(std::memory_order_relaxed);
  s.truncated = sh.truncated.load(std::memory_order_relaxed);
  s.split = sh.split.load(std::memory_order_relaxed);
  s.empty = sh.empty.load(std::memory_order_relaxed);
  s.padding_rows = sh.padding_rows.load(std::memory_order_relaxed);
  s.slots = sh.slots.load(std::memory_order_relaxed);
  if (sh.o.cut) {
    s.cut_documents = sh.o.cut->documents.load(std::memory_order_relaxed);
    s.cut_tokens = sh.o.cut->tokens.load(std::memory_order_relaxed);
    s.cut_partly = sh.o.cut->partly.load(std::memory_order_relaxed);
  }
  return s;
}

PackedLoader::State PackedLoader::state() const {
  const Shared& sh = *shared_;
  State st;
  st.documents = sh.documents->state();
  st.seq_len = sh.o.seq_len;
  st.batch_size = sh.o.batch_size;
  st.window_rows = sh.o.window_rows;
  st.mode = int(sh.o.mode);
  std::lock_guard<std::mutex> lock(sh.mu);
  if (sh.has_resume) {  // loaded, not started yet
    st.documents = sh.resume.documents;
    st.batches_done = sh.resume.batches_done;
    st.document = sh.resume.document;
    st.offset = sh.resume.offset;
    st.holes_world = sh.resume.holes_world;
    st.holes_base = sh.resume.holes_base;
    st.holes = sh.resume.holes;
  } else if (sh.active && !sh.finished) {
    st.documents.epoch = sh.epoch;
    st.documents.skipped = sh.skipped;
    st.batches_done = sh.batches_done;
    st.document = sh.document;
    st.offset = sh.offset;
    st.holes_world = sh.holes_world;
    st.holes_base = sh.holes_base;
    st.holes = sh.holes;
  } else {  // before the first epoch, or after one (or a set_epoch): the next from its start
    st.documents.epoch = sh.documents->next_epoch();
    st.documents.skipped = 0;
  }
  st.documents.batches_done = st.document / sh.docs_per_batch;
  return st;
}

namespace {

// The documents a rank of a layout has in an epoch of `left` documents (after those skipped):
// positions rank, rank + world, ... (packing splits documents without repeats).
int64_t DocsOfRank(int64_t left, int64_t world, int64_t rank) {
  return left > rank ? (left - rank - 1) / world + 1 : 0;
}

// A rank's cursor lies within its documents: before one of them, or inside it (an offset), or
// at their end (offset 0).
bool CursorFits(int64_t document, int64_t offset, int64_t have) {
  return document >= 0 && offset >= 0 && document <= have && (document < have || offset == 0);
}

// A state's holes (a resplit resume's saved layout) are consistent with it.
absl::Status CheckHoles(const PackedLoader::State& st, PackMode mode) {
  if (st.holes_world == 0 && st.holes_base == 0 && st.holes.empty()) return absl::OkStatus();
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("state_dict: resplit_from: ", what));
  };
  if (mode != PackMode::kConcat) return bad("a resplit position is for pack='concat' only");
  if (st.holes_world < 1 || st.holes_world > (int64_t{1} << 20) ||
      int64_t(st.holes.size()) != st.holes_world) {
    return bad("one cursor per rank of the saved layout is needed");
  }
  if (st.holes_base < 0 || st.holes_base > st.documents.skipped) {
    return bad("base must lie in [0, skipped]");
  }
  const int64_t left = st.documents.dataset_size - st.holes_base;
  for (int64_t r = 0; r < st.holes_world; ++r) {
    const PackedLoader::Cursor& c = st.holes[size_t(r)];
    if (!CursorFits(c.document, c.offset, DocsOfRank(left, st.holes_world, r))) {
      return bad(absl::StrCat("rank ", r, "'s cursor (document ", c.document, ", offset ", c.offset,
                              ") lies outside its documents"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status PackedLoader::Resplit(const std::vector<State>& states) {
  Shared& sh = *shared_;
  auto bad = [](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("load_state_dict(resplit=True): ", what));
  };
  if (sh.o.mode != PackMode::kConcat) {
    return bad(
        "exact for pack='concat' only: a best-fit or bucketed rank's state names the window it "
        "was in and how many of its rows it had given, not which documents those rows held");
  }
  if (states.empty()) return bad("no state given");
  const int64_t W = states[0].documents.world_size;
  if (W < 1 || int64_t(states.size()) != W) {
    return bad(absl::StrCat("the states of every rank of the saved layout are needed (",
                            states.size(), " given, world_size ", W,
                            "): save state_dict() on each rank"));
  }
  std::vector<const State*> by_rank(size_t(W), nullptr);
  const Loader::State mine = sh.documents->state();
  // A rank whose rows of epoch E ran out before the others' saves the start of epoch E + 1: it
  // had packed all of E's documents. E is the earliest epoch among the states.
  int64_t E = states[0].documents.epoch;
  for (const State& st : states) E = std::min(E, st.documents.epoch);
  auto finished = [E](const State& st) {
    return E < std::numeric_limits<int64_t>::max() && st.documents.epoch == E + 1 &&
           st.document == 0 && st.offset == 0 && st.batches_done == 0 &&
           st.documents.skipped == 0 && st.holes_world == 0;
  };
  const State* in_epoch = nullptr;  // a state inside epoch E, for its skipped prefix
  for (const State& st : states) {
    if (st.documents.epoch == E) in_epoch = &st;
  }
  for (const State& st : states) {
    const Loader::State& d = st.documents;
    if (st.mode != int(sh.o.mode) || st.seq_len != sh.o.seq_len ||
        st.window_rows != sh.o.window_rows) {
      return bad("a state of other packing options (mode, seq_len, window_rows)");
    }
    if (d.world_size != W || d.rank < 0 || d.rank >= W || by_rank[size_t(d.rank)] != nullptr) {
      return bad(absl::StrCat("rank ", d.rank, " of world_size ", d.world_size,
                              ": each rank of the saved layout once, all of one world size"));
    }
    by_rank[size_t(d.rank)] = &st;
    if (d.dataset_size != mine.dataset_size || d.dataset_fingerprint != mine.dataset_fingerprint ||
        d.shuffle != mine.shuffle || d.seed != mine.seed) {
      return bad("a state of another data set, seed or shuffle setting");
    }
    if (finished(st)) continue;  // the start of the next epoch: epoch E packed whole
    if (d.epoch != E || d.skipped != in_epoch->documents.skipped ||
        d.batch_size != in_epoch->documents.batch_size) {
      return bad("states of different epochs or runs (epoch, skipped, batch_size differ)");
    }
    if (st.holes_world != 0) {
      return bad(
          "the saved epoch was itself resumed on another world size: resplit once an "
          "epoch (or resume it on the layout that saved it)");
    }
    if (d.epoch < 0 || d.skipped < 0 || d.skipped > d.dataset_size || d.batch_size < 1) {
      return bad("an invalid saved position (epoch, skipped or batch_size)");
    }
    const int64_t left = d.dataset_size - d.skipped;
    const int64_t have = DocsOfRank(left, W, d.rank);
    if (!CursorFits(st.document, st.offset, have) || d.batches_done != st.document / d.batch_size) {
      return bad(absl::StrCat("rank ", d.rank, "'s position (document ", st.document, ", offset ",
                              st.offset, ") lies outside its ", have, " documents"));
    }
  }
  const State& first = *in_epoch;
  const int64_t base = first.documents.skipped;
  const int64_t left = first.documents.dataset_size - base;
  // The first position of the epoch's order (after base) that some saved rank had not packed
  // whole: everything before it is done, and this layout's ranks deal the rest.
  int64_t from = left;
  State next;  // where this layout starts: the saved layout's cursors as its holes
  next.seq_len = sh.o.seq_len;
  next.batch_size = sh.o.batch_size;
  next.window_rows = sh.o.window_rows;
  next.mode = int(sh.o.mode);
  next.holes_world = W;
  next.holes_base = base;
  next.holes.resize(size_t(W));
  for (int64_t r = 0; r < W; ++r) {
    const State& st = *by_rank[size_t(r)];
    const int64_t have = DocsOfRank(left, W, r);
    Cursor& c = next.holes[size_t(r)];
    c = finished(st) ? Cursor{have, 0} : Cursor{st.document, st.offset};
    if (c.document < have) from = std::min(from, c.document * W + r);
  }
  Loader::State d = mine;
  d.epoch = first.documents.epoch;
  d.batches_done = 0;
  d.skipped = base + from;
  if (from >= left) {  // every document was packed: the next epoch, from its start, no holes
    d.epoch = first.documents.epoch + 1;
    d.skipped = 0;
    next.holes_world = next.holes_base = 0;
    next.holes.clear();
  }
  if (absl::Status s = sh.documents->LoadState(d); !s.ok()) return s;
  next.documents = d;
  std::lock_guard<std::mutex> lock(sh.mu);
  sh.resume = std::move(next);
  sh.has_resume = true;
  return absl::OkStatus();
}

absl::Status PackedLoader::LoadState(const State& st) {
  Shared& sh = *shared_;
  if (st.mode != int(sh.o.mode) || st.seq_len != sh.o.seq_len || st.batch_size != sh.o.batch_size ||
      st.window_rows != sh.o.window_rows) {
    return absl::InvalidArgumentError(
        absl::StrCat("state_dict: made for packing (mode ", st.mode, ", seq_len ", st.seq_len,
                     ", batch_size ", st.batch_size, ", window_rows ", st.window_rows,
                     ") but this loader packs (mode ", int(sh.o.mode), ", seq_len ", sh.o.seq_len,
                     ", batch_size ", sh.o.batch_size, ", window_rows ", sh.o.window_rows, ")"));
  }
  if (st.document < 0 || st.offset < 0 || st.batches_done < 0 ||
      st.documents.batches_done != st.document / sh.docs_per_batch) {
    return absl::InvalidArgumentError("state_dict: an inconsistent packing position");
  }
  if (absl::Status s = CheckHoles(st, sh.o.mode); !s.ok()) return s;
  if (absl::Status s = sh.documents->LoadState(st.documents); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(sh.mu);
  sh.resume = st;
  sh.has_resume = true;
  return absl::OkStatus();
}

}  // namespace feedline::text
