// libfeedline_sentencepiece.so: SentencePiece behind the C table of sentencepiece_plugin_api.h.
// Everything here is hidden (-fvisibility=hidden) but the entry point.
//
// sentencepiece_processor.h declares its own names in namespace absl (0.1.97), which clash with
// Abseil's, so this file includes no Abseil header.
#include <sentencepiece_processor.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "text/sentencepiece_plugin_api.h"

namespace {

thread_local std::string t_error;

const char* SetError(const std::string& e) {
  t_error = e;
  return t_error.c_str();
}

struct Model {
  sentencepiece::SentencePieceProcessor sp;
};

const Model& M(const void* m) { return *static_cast<const Model*>(m); }

void* Load(const char* path, const char** error) {
  auto m = std::make_unique<Model>();
  const auto s = m->sp.Load(path);
  if (!s.ok()) {
    *error = SetError(s.ToString());
    return nullptr;
  }
  return m.release();
}

void Destroy(void* m) { delete static_cast<Model*>(m); }

// Past this many pieces a thread's proto is dropped after the call rather than kept (a piece
// keeps its message and two strings: ~100 bytes).
constexpr size_t kKeptPieces = 1 << 16;

struct EncodeBuffers {
  std::vector<int> ids;
  std::vector<uint32_t> begins, ends;
};

int64_t Encode(const void* model, const char* text, size_t len, const int** ids,
               const uint32_t** begins, const uint32_t** ends, const char** error) {
  // SentencePiece's Encode(text, &ids) builds a SentencePieceText message per call, a message
  // and two strings per piece, and frees them all: allocation took a third of a worker's time.
  // Its proto overload clears the message it is given instead, and protobuf keeps the cleared
  // pieces for reuse; so each thread keeps one (the way sentencepiece_processor.h shows, through
  // ImmutableSentencePieceText: Debian ships no sentencepiece.pb.h). The same ids: Encode(text,
  // &ids) is this call followed by the pieces' ids. 1.46x the tokens/s of one thread on the
  // bench corpus, and two threads scale 1.96x instead of 1.6-1.9x.
  thread_local std::unique_ptr<sentencepiece::ImmutableSentencePieceText> spt;
  thread_local EncodeBuffers out;
  if (spt == nullptr) spt = std::make_unique<sentencepiece::ImmutableSentencePieceText>();
  const auto s = M(model).sp.Encode(std::string_view(text, len), spt->mutable_proto());
  out.ids.clear();
  out.begins.clear();
  out.ends.clear();
  if (!s.ok()) {
    *error = SetError(s.ToString());
    return -1;
  }
  const size_t n = spt->pieces_size();
  const bool offsets = begins != nullptr || ends != nullptr;
  out.ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto piece = spt->pieces(int(i));
    out.ids.push_back(static_cast<int>(piece.id()));
    if (offsets) {
      out.begins.push_back(piece.begin());
      out.ends.push_back(piece.end());
    }
  }
  if (n > kKeptPieces) {
    spt.reset();
    // The output buffers stay until the next call (the caller copies them).
  }
  *ids = out.ids.data();
  if (begins != nullptr) *begins = out.begins.data();
  if (ends != nullptr) *ends = out.ends.data();
  return int64_t(n);
}

int TwoBestScores(const void* model, const char* text, size_t len, float* best, float* second,
                  const char** error) {
  thread_local sentencepiece::ImmutableNBestSentencePieceText nbest;
  const auto s = M(model).sp.NBestEncode(std::string_view(text, len), 2, nbest.mutable_proto());
  if (!s.ok()) {
    *error = SetError(s.ToString());
    return -1;
  }
  const size_t n = nbest.nbests_size();
  *best = n > 0 ? nbest.nbests(0).score() : 0;
  *second = n > 1 ? nbest.nbests(1).score() : -std::numeric_limits<float>::infinity();
  return 0;
}

int VocabSize(const void* m) { return M(m).sp.GetPieceSize(); }

const char* IdToPiece(const void* m, int id, size_t* len) {
  const std::string& p = M(m).sp.IdToPiece(id);  // a reference into the model's proto
  *len = p.size();
  return p.data();
}

int PieceFlags(const void* m, int id) {
  const auto& sp = M(m).sp;
  return (sp.IsUnknown(id) ? FEEDLINE_SPM_UNKNOWN : 0) |
         (sp.IsControl(id) ? FEEDLINE_SPM_CONTROL : 0) |
         (sp.IsUnused(id) ? FEEDLINE_SPM_UNUSED : 0) | (sp.IsByte(id) ? FEEDLINE_SPM_BYTE : 0);
}

float Score(const void* m, int id) { return M(m).sp.GetScore(id); }
int BosId(const void* m) { return M(m).sp.bos_id(); }
int EosId(const void* m) { return M(m).sp.eos_id(); }
int PadId(const void* m) { return M(m).sp.pad_id(); }

const feedline_spm_api kApi = {
    FEEDLINE_SPM_ABI_VERSION, Load,  Destroy, Encode, TwoBestScores, VocabSize, IdToPiece,
    PieceFlags,              Score, BosId,   EosId,  PadId,
};

}  // namespace

extern "C" __attribute__((visibility("default"))) const feedline_spm_api* feedline_spm_api_v1() {
  return &kApi;
}
