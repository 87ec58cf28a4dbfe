// libFuzzer target: SentencePiece through the word cache (src/text/word_cache.h) against
// SentencePiece alone, on the same model: every input (valid UTF-8, as the text sources hand
// the tokenizer) must encode to the same ids, the first time and again from a warm cache, and
// the cache must never have turned itself off (a self-check that found a difference).
//
// The model is trained once per process by spm_train (Debian's sentencepiece package) on a
// corpus made here: Zipf-distributed words, numbers whose segmentations tie ("7666"),
// punctuation. Half of the inputs are read as text; the other half pick words of that
// vocabulary and odd separators with their bytes, so that the cache is hit often.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "text/sentencepiece_model.h"
#include "text/utf8.h"
#include "text/word_cache.h"

namespace {

using feedline::text::SentencePieceModel;
using feedline::text::WordCachedEncoder;

const char* const kWords[] = {
    "the",    "of",       "and",   "a",     "to",    "kalo",      "mirensta", "Quar",
    "vilo,",  "ren.",     "7666",  "1000",  "66",    "6",         "2222",     "abab",
    "kakaka", "...",      "!!!",   "aaaa",  "ü",     "über",      "東京",     "\xE2\x98\x83",
    "x",      "9999",     "10000", "(the)", "\"a\"", "e\xCC\x81", " ",        "  ",
    "\t",     "\xC2\xA0", "\n",    "",      "-",     "'s"};
constexpr size_t kWordCount = sizeof(kWords) / sizeof(kWords[0]);

struct Encoders {
  std::shared_ptr<const SentencePieceModel> model;
  std::unique_ptr<WordCachedEncoder> cached;
};

Encoders* Make() {
  char dir[] = "/tmp/feedline-fuzz-spm-XXXXXX";
  if (::mkdtemp(dir) == nullptr) feedline::fuzz::Fail("mkdtemp");
  const std::string corpus = std::string(dir) + "/corpus.txt";
  {
    std::mt19937_64 rng(7);
    std::vector<double> weights;
    for (size_t i = 0; i < kWordCount; ++i) weights.push_back(1.0 / double(i + 1));
    std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
    const char* syllables[] = {"ka", "lo", "mi", "ren", "sta", "qu", "ar", "on", "tel", "vi"};
    std::ofstream out(corpus);
    for (int d = 0; d < 3000; ++d) {
      for (int k = 0; k < 20; ++k) {
        if (k > 0) out << ' ';
        if (rng() % 3 == 0) {
          out << kWords[pick(rng) % 30];
        } else if (rng() % 10 == 0) {
          out << rng() % 100000;
        } else {
          for (int s = 1 + int(rng() % 3); s > 0; --s) out << syllables[rng() % 10];
        }
      }
      out << '\n';
    }
  }
  const std::string cmd = "spm_train --input=" + corpus + " --model_prefix=" + dir +
                          "/m --vocab_size=500 --hard_vocab_limit=false "
                          "--character_coverage=0.9995 --minloglevel=2 > /dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) feedline::fuzz::Fail("spm_train failed", cmd);
  std::string error;
  auto* e = new Encoders;
  e->model = SentencePieceModel::Load(std::string(dir) + "/m.model", &error);
  if (e->model == nullptr) feedline::fuzz::Fail("model", error);
  e->cached = std::make_unique<WordCachedEncoder>(e->model, true);
  if (!e->cached->counters().enabled) feedline::fuzz::Fail("the cache is off for this model");
  std::system((std::string("rm -rf ") + dir).c_str());
  return e;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Encoders* e = Make();
  if (size == 0) return 0;
  std::string text;
  if (data[0] % 2 == 0) {
    // Words by the bytes: single spaces mostly, the byte's top bit glues two words.
    for (size_t i = 1; i < size; ++i) {
      if (i > 1 && (data[i] & 0x80) == 0) text += ' ';
      text += kWords[(data[i] & 0x7F) % kWordCount];
    }
  } else {
    text.assign(reinterpret_cast<const char*>(data) + 1, size - 1);
    size_t bad = 0;
    if (!feedline::text::ValidUtf8(reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                                   &bad)) {
      return 0;
    }
  }
  std::vector<int> want, got;
  std::string error;
  FUZZ_CHECK(e->model->Encode(text, &want, &error), error);
  for (int pass = 0; pass < 2; ++pass) {
    FUZZ_CHECK(e->cached->Encode(text, &got).ok(), text);
    FUZZ_CHECK(got == want, text);
  }
  FUZZ_CHECK(e->cached->counters().enabled, "the cache turned itself off at: " + text);
  return 0;
}
