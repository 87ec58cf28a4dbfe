// SentencePiece behind a plain-C++ face: sentencepiece_processor.h declares its own names in
// namespace absl (0.1.97), which clash with Abseil's, so it is included by
// sentencepiece_model.cc alone, which includes no Abseil header.
//
// Thread safety: Encode is const and may run on many threads at once (SentencePiece's
// processor is immutable once loaded).
#ifndef FEEDLINE_SRC_TEXT_SENTENCEPIECE_MODEL_H_
#define FEEDLINE_SRC_TEXT_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace feedline::text {

class SentencePieceModel {
 public:
  // Null with `error` set when the file is not a model.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();
  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
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
