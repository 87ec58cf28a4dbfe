#include "text/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace feedline::text {

struct SentencePieceModel::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceModel::SentencePieceModel() : impl_(std::make_unique<Impl>()) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  const auto s = m->impl_->sp.Load(path);
  if (!s.ok()) {
    *error = s.ToString();
    return nullptr;
  }
  return m;
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const auto s = impl_->sp.Encode(text, ids);
  if (!s.ok()) *error = s.ToString();
  return s.ok();
}

int SentencePieceModel::vocab_size() const { return impl_->sp.GetPieceSize(); }
int SentencePieceModel::bos_id() const { return impl_->sp.bos_id(); }
int SentencePieceModel::eos_id() const { return impl_->sp.eos_id(); }
int SentencePieceModel::pad_id() const { return impl_->sp.pad_id(); }

}  // namespace feedline::text
