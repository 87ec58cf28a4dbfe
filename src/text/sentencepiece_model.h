// SentencePiece behind a plain-C++ face. The tokenizer itself lives in feedline's plugin,
// libfeedline_sentencepiece.so, loaded on first use with local symbol binding
// (sentencepiece_plugin_api.h says why: a program that links LibTorch dies before main when
// Debian's libsentencepiece is in its global symbol scope).
//
// Thread safety: Encode is const and may run on many threads at once (SentencePiece's
// processor is immutable once loaded).
#ifndef FEEDLINE_SRC_TEXT_SENTENCEPIECE_MODEL_H_
#define FEEDLINE_SRC_TEXT_SENTENCEPIECE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace feedline::text {

class SentencePieceModel {
 public:
  // Null with `error` set when the file is not a model or the plugin cannot be loaded.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  // The same ids, with each piece's byte range [begins[i], ends[i]) in `text` (SentencePiece's
  // alignment of the normalized pieces to the input; a dummy prefix has an empty range).
  // `begins` and `ends` may be null (Encode).
  bool EncodeWithOffsets(std::string_view text, std::vector<int>* ids,
                         std::vector<uint32_t>* begins, std::vector<uint32_t>* ends,
                         std::string* error) const;
  // The scores of `text`'s best and second-best segmentations (SentencePiece's n-best;
  // `second` is -infinity when there is only one).
  bool TwoBestScores(std::string_view text, float* best, float* second, std::string* error) const;
  const std::string& IdToPiece(int id) const;
  bool IsUnknown(int id) const;
  // Not a control, unknown, unused or byte piece: one that text can match.
  bool IsNormal(int id) const;
  float Score(int id) const;
  int vocab_size() const;
  int bos_id() const;
  int eos_id() const;
  int pad_id() const;

 private:
  SentencePieceModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace feedline::text

#endif  // FEEDLINE_SRC_TEXT_SENTENCEPIECE_MODEL_H_
