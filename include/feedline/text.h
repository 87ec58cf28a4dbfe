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

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "feedline/dataset.h"
#include "feedline/transform.h"

namespace feedline::text {

enum class TokenDType { kUint16, kUint32 };

struct TokenFileOptions {
  std::string path;
  TokenDType dtype = TokenDType::kUint16;
  int64_t seq_len = 1024;  // tokens per input row; a window holds seq_len + 1
  int64_t vocab_size = 0;  // > 0: token ids must be below it
};

struct TokenWindows {
  std::shared_ptr<const Dataset> dataset;  // one sample per window; empty records
  std::shared_ptr<SampleTransform> transform;
  int64_t tokens = 0;  // in the file
};

absl::StatusOr<TokenWindows> OpenTokenWindows(const TokenFileOptions& options);

// --- Documents --------------------------------------------------------------------------------
//
// A text file with one document per line (blank lines are not documents), or JSON Lines with
// the document's text in `field`. Sample i is the i-th document; records hold its line.
struct TextFileOptions {
  std::string path;
  std::string field;  // empty: plain text lines; else JSON Lines, the text in this string field
};
// kNotFound for a missing file; kDataLoss for a file without any document.
absl::StatusOr<std::shared_ptr<const Dataset>> OpenTextLines(const TextFileOptions& options);

// The tokenizer seam: text (valid UTF-8) to ids. Implementations must be thread-safe (one
// instance is shared by every worker).
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual absl::Status Encode(absl::string_view text, std::vector<int>* ids) const = 0;
  virtual int vocab_size() const = 0;
  virtual int bos_id() const = 0;  // -1 when the model has none
  virtual int eos_id() const = 0;
  virtual int pad_id() const = 0;
};

// A SentencePiece model file (the user's, `spm_train`'s .model): ids equal Python
// `sentencepiece`'s `encode` for the same model.
absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadSentencePiece(const std::string& model_path);

struct TokenizeOptions {
  std::shared_ptr<const Tokenizer> tokenizer;
  int64_t max_length = 512;  // longer documents are truncated (after BOS/EOS are added)
  bool add_bos = false, add_eos = false;
  std::string field;  // JSON Lines: the text field (as in TextFileOptions)
};

// Documents to "input_ids" (int64 [<= max_length]) — from OpenTextLines' records, or from
// WebDataset keys (OpenWebDataset: the ".txt" member, or with `field` the ".json" one) — padded to each batch's longest with the
// tokenizer's pad id (0 when it has none), the lengths beside them. A line that is not valid
// UTF-8, a JSON line that does not parse or lacks the string field, and an empty document are
// DataErrors naming the file and the line.
absl::StatusOr<std::shared_ptr<SampleTransform>> MakeTokenizeTransform(
    const TokenizeOptions& options);

}  // namespace feedline::text

#endif  // FEEDLINE_TEXT_H_
