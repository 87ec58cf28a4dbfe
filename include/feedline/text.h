// feedline — the text built-ins: token windows from pre-tokenized token files, and documents
// from text / JSON Lines files tokenized in the workers (SentencePiece), padded per batch.
//
// A token file is a flat binary array of token ids, uint16 or uint32 little-endian (nanoGPT's
// `train.bin`, or any `np.array(ids, dtype).tofile(path)`). It is memory-mapped; sample i is the
// window of seq_len + 1 tokens starting at token i * (seq_len + 1): the windows tile the file
// (every token in exactly one window; the tail shorter than a window is left out) and each
// epoch visits every window once, in the engine's (shuffled, sharded, resumable) order. The
// transform writes
//   "input_ids"  int64 [seq_len]  tokens [start, start + seq_len)
//   "labels"     int64 [seq_len]  tokens [start + 1, start + seq_len + 1) (shifted by one)
// straight from the mapping into the batch slot (no copy before it).
//
//   auto windows = feedline::text::OpenTokenWindows({"train.bin", TokenDType::kUint16, 1024});
//   auto loader = feedline::Loader::Create(windows->dataset, windows->transform,
//                                          feedline::LoaderOptions().batch_size(32).seed(1));
//
// Errors (kDataLoss, naming the file): a size that is not a multiple of the token size, fewer
// tokens than one window; at the sample that holds it, a token id >= vocab_size (when given),
// naming the file and the token's offset.
//
// Thread safety: the data set and the transform are immutable; any number of workers.
#ifndef FEEDLINE_TEXT_H_
#define FEEDLINE_TEXT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "feedline/batch.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"
#include "feedline/mix.h"
#include "feedline/options.h"
#include "feedline/transform.h"

namespace feedline::text {

enum class TokenDType { kUint16, kUint32 };

// Documents a transform cut to its max_length, and the tokens that cut dropped (counted from any
// worker thread; read by whoever shares it: PackOptions::cut, stats). Nothing is dropped
// silently: a packed loader reports these in its PackStats. A document of more than 64 KiB far
// longer than max_length is tokenized only as far as its kept tokens need (the work and memory
// are bounded by max_length, not by the document): it is counted in `partly`, and its dropped
// tokens only as far as it was tokenized (so `tokens` is then a lower bound).
struct CutCounter {
  std::atomic<int64_t> documents{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> partly{0};
  void Add(int64_t dropped, bool tokenized_in_part = false) {
    if (dropped <= 0) return;
    documents.fetch_add(1, std::memory_order_relaxed);
    tokens.fetch_add(dropped, std::memory_order_relaxed);
    if (tokenized_in_part) partly.fetch_add(1, std::memory_order_relaxed);
  }
};

struct TokenFileOptions {
  std::string path;
  TokenDType dtype = TokenDType::kUint16;
  int64_t seq_len = 1024;  // tokens per input row; a window holds seq_len + 1
  int64_t vocab_size = 0;  // > 0: token ids must be below it
  std::string name = "";   // names the file in messages (default: path; a LocalCopy's URL)
};

struct TokenWindows {
  std::shared_ptr<const Dataset> dataset;  // one sample per window; empty records
  std::shared_ptr<SampleTransform> transform;
  int64_t tokens = 0;  // in the file
};

absl::StatusOr<TokenWindows> OpenTokenWindows(const TokenFileOptions& options);

// Documents of a token file, for packing (PackedLoader): a document index beside it holds the
// token offsets where documents start, as n + 1 little-endian uint64 (0 first, the file's token
// count last; `np.array(offsets, np.uint64).tofile(path)`). Sample i is document i: "input_ids"
// int32 ragged [<= max_length] (longer ones truncated), then `eos_id` when >= 0. Errors
// (kDataLoss, naming the file): an index that is not such offsets; at the sample, an empty
// document or a token id >= vocab_size (when given).
struct TokenDocumentOptions {
  std::string path;
  TokenDType dtype = TokenDType::kUint16;
  std::string index_path;
  int64_t vocab_size = 0;
  int64_t max_length = 65536;
  int64_t eos_id = -1;
  std::shared_ptr<CutCounter> cut;  // when set: documents cut to max_length are counted there
  std::string name = "";            // names the file in messages (default: path)
  std::string index_name = "";      // names the index in messages (default: index_path)
};
struct TokenDocuments {
  std::shared_ptr<const Dataset> dataset;
  std::shared_ptr<SampleTransform> transform;
  int64_t tokens = 0;
};
absl::StatusOr<TokenDocuments> OpenTokenDocuments(const TokenDocumentOptions& options);

// --- Documents --------------------------------------------------------------------------------
//
// A text file with one document per line (blank lines are not documents), or JSON Lines with
// the document's text in `field`. Sample i is the i-th document; records hold its line.
struct TextFileOptions {
  std::string path;
  std::string field;      // empty: plain text lines; else JSON Lines, the text in this string field
  std::string name = "";  // names the file in samples and messages (default: path)
};
// kNotFound for a missing file; kDataLoss for a file without any document.
absl::StatusOr<std::shared_ptr<const Dataset>> OpenTextLines(const TextFileOptions& options);

// The tokenizer seam: text (valid UTF-8) to ids. Implementations must be thread-safe (one
// instance is shared by every worker). A document much longer than max_length is given in
// prefixes (ending before whitespace where there is some): the first ids of a prefix must be the
// whole text's, as SentencePiece's and BPE tokenizers' are (the last 64 of a prefix are never
// kept).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual absl::Status Encode(absl::string_view text, std::vector<int>* ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1 when the model has none
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;
  // What a cache saved (LoadSentencePiece's word cache); zeros for tokenizers without one.
  struct Counters {
    bool word_cache = false;   // in use
    int64_t documents = 0;     // encoded through the cache
    int64_t words = 0;         // looked up in it
    int64_t cached_words = 0;  // of them, found
  };
  virtual Counters counters() const { return {}; }
};

struct SentencePieceOptions {
  // Keep each word's ids in a per-thread cache (bounded: 2^17 words a thread): a word seen
  // before costs a hash lookup instead of SentencePiece's segmentation. The ids stay exactly
  // SentencePiece's (the cache is used only with models whose pieces never span whitespace, as
  // spm_train makes them by default, and checks itself; src/text/word_cache.h says how).
  bool word_cache = true;
};

// A SentencePiece model file (the user's, `spm_train`'s .model): ids equal Python
// `sentencepiece`'s `encode` for the same model.
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadSentencePiece(
    const std::string& model_path, const SentencePieceOptions& options = {});

struct TokenizeOptions {
  std::shared_ptr<const Tokenizer> tokenizer;
  int64_t max_length = 512;  // longer documents are truncated (after BOS/EOS are added)
  bool add_bos = false, add_eos = false;
  std::string field;  // JSON Lines: the text field (as in TextFileOptions)
  // The "input_ids" field: padded int64 (TextLoader's batches), or ragged int32 (the packer's
  // input: documents back to back with offsets, 4 bytes a token in the ring).
  bool ragged = false;
  std::shared_ptr<CutCounter> cut;  // when set: documents cut to max_length are counted there
};

// Documents to "input_ids" (int64 [<= max_length]) — from OpenTextLines' records, or from
// WebDataset keys (OpenWebDataset: the ".txt" member, or with `field` the ".json" one) —
// padded to each batch's longest with the tokenizer's pad id (0 when it has none), the lengths
// beside them (or ragged int32, see `ragged`). A line that is not valid UTF-8, a JSON line that
// does not parse or lacks the string field, and an empty document are DataErrors naming the
// file and the line.
absl::StatusOr<std::shared_ptr<SampleTransform>> MakeTokenizeTransform(
    const TokenizeOptions& options);

// --- Packing ----------------------------------------------------------------------------------
//
// Rows of exactly `seq_len` tokens made from tokenized documents (a Loader whose "input_ids"
// field is ragged: MakeTokenizeTransform with `ragged`), in the documents' epoch order:
//   kConcat   the documents' tokens back to back, cut into rows (GPT pre-training): a document
//             may continue in the next row; only the epoch's last row has padding.
//   kBestFit  whole documents placed into rows by best fit, a window of the epoch's order at a
//             time (the documents that fill `window_rows` rows; SFT): no document is cut, except
//             one longer than a row (split into seq_len pieces, or truncated, by `split_long`); the
//             rest of a row is padding.
// Each batch (int64 [B, seq_len] unless noted):
//   "input_ids"      the tokens; padding holds `pad_id`
//   "labels"         the next token of the same document; -100 at padding and at a document's
//                    last token (with kConcat and mask_boundaries = false: the next document's
//                    first token instead; a row's last label is the stream's next token)
//   "position_ids"   0, 1, ... from the start of each segment (a document's run of tokens in
//                    a row); 0 at padding
//   "attention_mask" 1 at tokens, 0 at padding
//   "cu_seqlens"     int32 ragged: where each segment starts in the flattened batch [B * seq_len]
//                    (padding is a segment), and B * seq_len last (flash-attention's varlen
//                    layout)
// and the batch's indices() are each row's first document.
//
// The packer runs on the consumer's thread over the document loader's batches (tokenization
// stays in its worker threads, autotuned). It holds no tokens across batches beyond the current
// document (kConcat) or window (kBestFit), so its state is small: a resumed run (LoadState)
// gives the uninterrupted run's batches bit for bit, whatever the worker count. Rows per epoch
// are known only once the epoch's documents are tokenized (no num_batches).
//
// Ranks (the document loader's rank / world_size): with kConcat and kBestFit each document is
// packed on one rank only (the documents are split without DistributedSampler's repeats:
// MakePackedTextLoader and MakePackedTokenLoader set even_shards = false), so ranks may run out
// of rows at different steps. Every rank must still take the same number of steps (a rank that
// stops early leaves the others waiting in their next collective): the ranks agree, each step,
// whether any of them still has rows, and a rank that has none takes PaddingBatch() until none
// has (Python's TextLoader and TokenLoader do this over torch.distributed). kBucket splits the
// documents as DistributedSampler does: every rank the same number of batches.
//
// kBucket is not packing but its relative for padded batches (length bucketing): each batch
// holds batch_size documents of similar lengths — a window of window_rows * batch_size
// documents of the epoch's order is sorted by length, cut into batches, and the batches
// shuffled — as "input_ids" int64 [B, the batch's longest, at most seq_len] padded with
// pad_id, each document's length beside it (TensorView::lengths), indices() its documents.
enum class PackMode { kConcat, kBestFit, kBucket };

struct PackOptions {
  PackMode mode = PackMode::kConcat;
  int64_t seq_len = 2048;
  int64_t batch_size = 8;       // rows per batch
  int64_t window_rows = 128;    // kBestFit: the documents packed together fill this many rows
                                // (kBucket: window_rows batches are sorted together)
  bool split_long = true;       // kBestFit: cut a document longer than seq_len (else truncate)
  bool mask_boundaries = true;  // kConcat: labels -100 at each document's last token
  bool drop_last = false;       // drop the epoch's last batch when it has fewer rows
  int64_t pad_id = 0;
  // The document transform's counter (TokenizeOptions::cut, TokenDocumentOptions::cut): its
  // documents cut to max_length before packing, reported in PackStats.
  std::shared_ptr<const CutCounter> cut;
};

struct PackStats {
  int64_t rows = 0;       // kBucket: documents
  int64_t tokens = 0;     // real tokens in those rows
  int64_t slots = 0;      // tokens the batches hold, padding included
  int64_t documents = 0;  // documents taken
  int64_t truncated = 0;  // kBestFit: documents cut to seq_len (split_long = false)
  int64_t split = 0;      // kBestFit: documents split into pieces
  int64_t empty = 0;      // documents without tokens, skipped
  // Rows of padding only, in batches a rank took after its last row so that every rank takes
  // the same number of steps (PackedEpoch::PaddingBatch); their tokens count in `slots`.
  int64_t padding_rows = 0;
  // Documents longer than the document transform's max_length, cut to it before packing, and
  // the tokens that dropped (PackOptions::cut; 0 without it).
  int64_t cut_documents = 0;
  int64_t cut_tokens = 0;    // a lower bound when cut_partly > 0
  int64_t cut_partly = 0;    // of cut_documents, those tokenized only in part (CutCounter)
  double efficiency() const {  // real tokens / slots
    return slots > 0 ? double(tokens) / double(slots) : 0.0;
  }
};

class PackedLoader;

class PackedEpoch {
 public:
  ~PackedEpoch();
  PackedEpoch(const PackedEpoch&) = delete;
  PackedEpoch& operator=(const PackedEpoch&) = delete;
  // The next batch of rows; kOutOfRange at the end of the epoch; a document's error (under
  // OnError::kRaise) at the batch where it would have been packed (the next call goes on).
  absl::StatusOr<Batch> Next();
  absl::StatusOr<Batch> Next(const std::function<absl::Status()>& interrupted, absl::Duration poll);
  // A batch of batch_size rows that hold no data, for a rank whose rows have run out while
  // another rank's have not: input_ids pad_id, labels -100, position_ids 0, attention_mask 0,
  // one padding segment per row in cu_seqlens, indices -1. The model's loss and gradients get
  // nothing from it; it is not part of the resume state. Counted in PackStats::padding_rows.
  // kFailedPrecondition for kBucket (its ranks have equal batch counts).
  absl::StatusOr<Batch> PaddingBatch();
  int64_t epoch() const noexcept;
  void Cancel();

 private:
  friend class PackedLoader;
  struct Run;
  explicit PackedEpoch(std::unique_ptr<Run> run);
  std::unique_ptr<Run> run_;
};

class PackedLoader {
 public:
  // kInvalidArgument: a document loader without a ragged int32/int64 "input_ids" field, or an
  // option out of range (seq_len, batch_size, window_rows >= 1; batch_size * seq_len < 2^31).
  static absl::StatusOr<std::unique_ptr<PackedLoader>> Create(std::unique_ptr<Loader> documents,
                                                              PackOptions options);
  ~PackedLoader();
  PackedLoader(const PackedLoader&) = delete;
  PackedLoader& operator=(const PackedLoader&) = delete;

  // Starts the next epoch (cancelling one in progress), or the one a LoadState left off.
  std::unique_ptr<PackedEpoch> StartEpoch();
  void set_epoch(int64_t epoch);
  int64_t next_epoch() const noexcept;
  Loader& documents() noexcept;  // its stats, workers, trace
  const Loader& documents() const noexcept;
  const PackOptions& options() const noexcept;
  PackStats pack_stats() const;  // over every epoch so far

  // Where the packer is: the document loader's state (epoch, seed, layout) plus the row cursor
  // — kConcat: the next document's position in the epoch and the tokens of it already packed;
  // kBestFit: the window and its rows already yielded. A few hundred bytes.
  struct Cursor {
    int64_t document = 0, offset = 0;
  };
  struct State {
    Loader::State documents;
    int64_t batches_done = 0;
    int64_t document = 0;  // kConcat: position in the epoch; kBestFit: the window's first one
    int64_t offset = 0;    // kConcat: tokens of it packed; kBestFit: rows of the window yielded
    int64_t seq_len = 0, batch_size = 0, window_rows = 0;
    int mode = 0;
    // After a resume on another world size (Resplit), for the rest of that epoch: the saved
    // layout's ranks' cursors, rank by rank, over the positions after `holes_base` of the
    // epoch's order (what they had delivered lies among this layout's positions too: the
    // packer steps over it, and starts a document one of them had begun at its offset).
    // holes_world 0: none.
    int64_t holes_world = 0;
    int64_t holes_base = 0;
    std::vector<Cursor> holes;
  };
  State state() const;
  // kInvalidArgument for a state of other packing options or of another document loader (as
  // Loader::LoadState).
  absl::Status LoadState(const State& state);
  // Exact elastic resume (kConcat): `states` are the states of every rank of a saved layout
  // (any world size; one each, any order), saved at the same epoch. The next epoch goes on on
  // this loader's layout: the documents no saved rank had packed — and the rest of each one a
  // saved rank was inside, from its offset — are dealt over this layout's ranks as a whole
  // epoch's would be, each token once, none that was packed again; the next epochs are this
  // layout's own. kInvalidArgument for other packing options or data, a missing or repeated
  // rank, states of different epochs, a state that was itself resplit in the same epoch, and
  // kBestFit / kBucket (a saved rank's rows of its current window are not known from its state).
  absl::Status Resplit(const std::vector<State>& states);

  struct Shared;  // the implementation's (src/text/packing.cc)

 private:
  explicit PackedLoader(std::shared_ptr<Shared> shared);
  std::shared_ptr<Shared> shared_;
};

// Text loaders in one call, as Python's TextLoader makes them: the documents of `source` — a
// text or JSON Lines file (`tokenize.field` names the JSON field), an http(s):// or s3:// URL of
// one (downloaded once into feedline's cache, within options.read_timeout_ms()), or WebDataset
// shards (a ".tar" path or a brace pattern, local or remote: one document per key, its ".txt"
// member, or with `field` its ".json") — tokenized by `tokenize` in the loader's workers.
// Linked from feedline::feedline (files and HTTP are io's, tokenizing is text's).
absl::StatusOr<std::unique_ptr<Loader>> MakeTextLoader(const std::string& source,
                                                       TokenizeOptions tokenize,
                                                       LoaderOptions options);
// The documents of `source` as MakeTextLoader reads them (a record's bytes: one document's
// text), for a data set of documents of your own making: feedline::Mix over several sources.
absl::StatusOr<std::shared_ptr<const Dataset>> OpenTextDocuments(const std::string& source,
                                                                 const std::string& field,
                                                                 double read_timeout_ms);
// MakeTextLoader and MakePackedTextLoader over documents given (OpenTextDocuments, a Mix).
absl::StatusOr<std::unique_ptr<Loader>> MakeTextLoader(std::shared_ptr<const Dataset> documents,
                                                       TokenizeOptions tokenize,
                                                       LoaderOptions options);
absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTextLoader(
    std::shared_ptr<const Dataset> documents, TokenizeOptions tokenize, PackOptions pack,
    LoaderOptions options);
// Packed rows of those documents: `options` is the document loader's (its batch_size the
// documents tokenized at a time), `pack` the rows' (batch_size rows of seq_len); the documents
// are tokenized ragged, the cuts counted in tokenize.cut (made when null) and pack.cut, and the
// rows padded with the tokenizer's pad id (0 when it has none).
absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTextLoader(const std::string& source,
                                                                   TokenizeOptions tokenize,
                                                                   PackOptions pack,
                                                                   LoaderOptions options);
// Token windows of a token file (OpenTokenWindows) whose `tokens.path` may be an http(s):// or
// s3:// URL (downloaded once into feedline's cache; messages name the URL), on the engine.
absl::StatusOr<std::unique_ptr<Loader>> MakeTokenLoader(TokenFileOptions tokens,
                                                        LoaderOptions options);
// Packed rows of a token file's documents (OpenTokenDocuments; the file and its index may be
// URLs, fetched together): `options` and `pack` as for MakePackedTextLoader. The cuts are
// counted in docs.cut (made when null), shared with pack.cut.
absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTokenLoader(TokenDocumentOptions docs,
                                                                    PackOptions pack,
                                                                    LoaderOptions options);
// Several token files as one source in set proportions (feedline/mix.h): a Mix over their
// windows (or documents) with each file's own transform (PerSourceTransform; paths may be
// URLs, fetched as above). Every file of a mixture has the loader's seq_len (windows) or
// max_length (documents); their dtypes and vocabularies may differ. For documents the cuts of
// every file are counted in one CutCounter (the first file's docs.cut, made when null).
struct TokenMix {
  std::shared_ptr<Mix> mix;
  std::shared_ptr<SampleTransform> transform;
  std::shared_ptr<CutCounter> cut;  // documents only
};
absl::StatusOr<TokenMix> MixTokenWindows(std::vector<TokenFileOptions> files,
                                         const std::vector<double>& weights, const MixOptions& mix,
                                         double read_timeout_ms);
absl::StatusOr<TokenMix> MixTokenDocuments(std::vector<TokenDocumentOptions> files,
                                           const std::vector<double>& weights,
                                           const MixOptions& mix, double read_timeout_ms);
// Packed rows of a mixture's documents (MixTokenDocuments), as MakePackedTokenLoader packs one
// file's.
absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTokenLoader(const TokenMix& documents,
                                                                    PackOptions pack,
                                                                    LoaderOptions options);
// A SentencePiece model by path or URL (a URL's local copy is loaded, fetched within
// `read_timeout_ms`; messages name the URL).
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadSentencePieceFrom(
    const std::string& model, const SentencePieceOptions& options = {},
    double read_timeout_ms = LoaderOptions().read_timeout_ms());

}  // namespace feedline::text

namespace feedline {
// The text built-in's enums by name, as Python takes them (and as a packed state records its
// mode).
template <>
struct EnumNames<text::TokenDType> {
  static constexpr std::pair<const char*, text::TokenDType> kValues[] = {
      {"uint16", text::TokenDType::kUint16}, {"uint32", text::TokenDType::kUint32}};
};
template <>
struct EnumNames<text::PackMode> {
  static constexpr std::pair<const char*, text::PackMode> kValues[] = {
      {"concat", text::PackMode::kConcat},
      {"bestfit", text::PackMode::kBestFit},
      {"bucket", text::PackMode::kBucket}};
};
}  // namespace feedline

#endif  // FEEDLINE_TEXT_H_
