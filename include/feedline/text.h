// feedline — the text built-ins. First: token windows from pre-tokenized token files.
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

#include "absl/status/statusor.h"
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

}  // namespace feedline::text

#endif  // FEEDLINE_TEXT_H_
