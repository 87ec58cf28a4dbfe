// SentencePiece's word cache (src/text/word_cache.h): the ids of every document equal
// SentencePiece's own for the whole document, with models trained here by spm_train (Debian's
// sentencepiece package), on one thread and on several sharing a tokenizer; and the cache turns
// itself off for models whose pieces span whitespace.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "feedline/text.h"
#include "test_util.h"
#include "text/word_cache.h"

namespace feedline::text {
namespace {

// Zipf-distributed words (common English, made-up words, Unicode ones, numbers), commas, full
// stops and capitals, log-normal lengths: natural text's shape.
std::vector<std::string> Documents(int n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::string> words = {"the",  "of",    "and",  "to",     "in",  "a",
                                    "is",   "that",  "for",  "it",     "was", "über",
                                    "café", "naïve", "東京", "データ", "🙂"};
  const char* syllables[] = {"ka", "lo", "mi", "ren", "sta", "qu", "ar", "on", "tel", "vi"};
  for (int i = 0; i < 3000; ++i) {
    std::string w;
    for (int k = 1 + int(rng() % 4); k > 0; --k) w += syllables[rng() % 10];
    words.push_back(w);
  }
  std::vector<double> weights;
  for (size_t i = 0; i < words.size(); ++i) weights.push_back(1.0 / double(i + 1));
  std::discrete_distribution<size_t> pick(weights.begin(), weights.end());
  std::lognormal_distribution<double> length(3.0, 1.0);
  std::vector<std::string> docs;
  for (int d = 0; d < n; ++d) {
    std::string doc;
    const int len = 1 + std::min(1500, int(length(rng)));
    for (int k = 0; k < len; ++k) {
      if (k > 0) doc += ' ';
      const uint64_t kind = rng() % 100;
      std::string w = kind == 0 ? std::to_string(rng() % 100000) : words[pick(rng)];
      if ((k == 0 || doc[doc.size() - 2] == '.') && w[0] >= 'a' && w[0] <= 'z') w[0] -= 32;
      doc += w;
      if (kind > 94) doc += ',';
      if (kind > 90 && kind <= 94) doc += '.';
    }
    docs.push_back(doc);
  }
  return docs;
}

// What the cache's word cutting must survive: spaces that are not single or not between ASCII
// graphic characters, whitespace SentencePiece normalizes, combining marks after a space,
// characters the model has never seen (unknown pieces, which SentencePiece merges), the empty
// document.
const std::vector<std::string>& HardDocuments() {
  static const std::vector<std::string> docs = {
      "the cat",
      "the  cat",
      " the cat ",
      "the\tcat the\ncat",
      "a b c d e f g a b c d e f g",
      "the\xC2\xA0"
      "cat the\xE3\x80\x80"
      "cat",  // NBSP, ideographic space
      "the \xCC\x81"
      "cat e \xCC\x81 x",                                        // combining acute after a space
      "\xE2\x98\x83 \xE2\x98\x83\xE2\x98\x83 the \xE2\x98\x83",  // snowmen: unknown
      "ab\xE2\x98\x83 \xE2\x98\x83"
      "cd ab\xE2\x98\x83 \xE2\x98\x83"
      "cd",
      "\xEF\xBC\xA1\xEF\xBC\xA2 the \xEF\xBC\xA1",  // fullwidth letters (NFKC)
      "x, y. Z! (the) \"cat\" 1 2 3 1,000.5",
      "",
      " ",
      "   ",
      "a",
      "東京 データ 東京 the 東京",
      std::string(60, 'k') + " " + std::string(60, 'k') + " the"};
  return docs;
}

// Words whose segmentations tie ("6" "66" against "66" "6") or nearly, early in a document and
// after thousands of words (where SentencePiece's float sums round coarsely).
std::vector<std::string> TieDocuments() {
  const std::string ties = "1000 7666 2222 66666 abab kakaka lololo ... !!! aaaa 10000 9999";
  std::string prose;
  for (int k = 0; k < 400; ++k) prose += "the kalo of mirensta and quar " + ties + " ";
  return {ties, "the " + ties, prose + ties, ties + " " + prose};
}

struct Model {
  testing::TempDir dir;
  std::string path;
  std::vector<std::string> docs;
  Model(const std::string& flags, int documents) : docs(Documents(documents, 11)) {
    std::string text;
    for (const std::string& d : docs) text += d + "\n";
    testing::WriteFile(dir.path() + "/corpus.txt", text);
    const std::string cmd = "spm_train --input=" + dir.path() +
                            "/corpus.txt --model_prefix=" + dir.path() +
                            "/m --vocab_size=800 --hard_vocab_limit=false "
                            "--character_coverage=0.9995 --minloglevel=2 " +
                            flags + " > /dev/null 2>&1";
    REQUIRE(std::system(cmd.c_str()) == 0);
    path = dir.path() + "/m.model";
    for (const std::string& d : HardDocuments()) docs.push_back(d);
    for (const std::string& d : TieDocuments()) docs.push_back(d);
  }
};

std::shared_ptr<const Tokenizer> Load(const std::string& path, bool word_cache) {
  SentencePieceOptions o;
  o.word_cache = word_cache;
  auto t = LoadSentencePiece(path, o);
  REQUIRE(t.ok());
  return *t;
}

TEST_CASE("word cache: SentencePiece's ids for every document, on one thread and on four",
          "[text]") {
  for (const char* type : {"--model_type=unigram", "--model_type=bpe"}) {
    INFO(type);
    Model m(type, 1500);
    auto plain = Load(m.path, false), cached = Load(m.path, true);
    CHECK_FALSE(plain->counters().word_cache);
    std::vector<std::vector<int>> want(m.docs.size());
    for (size_t i = 0; i < m.docs.size(); ++i) REQUIRE(plain->Encode(m.docs[i], &want[i]).ok());
    // Twice over on one thread (the second pass from the cache), then four threads at once,
    // each from its own end of the list.
    std::vector<int> ids;
    for (int pass = 0; pass < 2; ++pass) {
      for (size_t i = 0; i < m.docs.size(); ++i) {
        REQUIRE(cached->Encode(m.docs[i], &ids).ok());
        REQUIRE(ids == want[i]);
      }
    }
    std::vector<int> wrong(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        std::vector<int> mine;
        for (size_t k = 0; k < m.docs.size(); ++k) {
          const size_t i = t % 2 == 0 ? k : m.docs.size() - 1 - k;
          if (!cached->Encode(m.docs[i], &mine).ok() || mine != want[i]) ++wrong[size_t(t)];
        }
      });
    }
    for (std::thread& t : threads) t.join();
    CHECK(wrong == std::vector<int>(4, 0));
    const Tokenizer::Counters c = cached->counters();
    CHECK(c.word_cache);  // still on: no check found a difference
    CHECK(c.documents == int64_t(m.docs.size()) * 6);
    // Warm, the corpus's documents take nearly every word from the cache.
    for (size_t i = 0; i < 1500; ++i) REQUIRE(cached->Encode(m.docs[i], &ids).ok());
    const Tokenizer::Counters d = cached->counters();
    CHECK(d.cached_words - c.cached_words > (d.words - c.words) * 9 / 10);
  }
}

TEST_CASE("word cache: off for models whose pieces span whitespace, with the same ids", "[text]") {
  for (const char* flags : {"--split_by_whitespace=false", "--treat_whitespace_as_suffix=true",
                            "--add_dummy_prefix=false"}) {
    INFO(flags);
    Model m(flags, 400);
    auto plain = Load(m.path, false), cached = Load(m.path, true);
    std::vector<int> a, b;
    for (const std::string& d : m.docs) {
      REQUIRE(plain->Encode(d, &a).ok());
      REQUIRE(cached->Encode(d, &b).ok());
      REQUIRE(a == b);
    }
    CHECK_FALSE(cached->counters().word_cache);
  }
}

TEST_CASE("word cache: its lattice's margins are SentencePiece's n-best ones", "[text]") {
  Model m("--model_type=unigram", 1500);
  std::string error;
  std::shared_ptr<const SentencePieceModel> model = SentencePieceModel::Load(m.path, &error);
  REQUIRE(model != nullptr);
  WordCachedEncoder encoder(model, true);
  std::set<std::string> words;
  for (const std::string& d : m.docs) {
    for (absl::string_view w : absl::StrSplit(d, ' ', absl::SkipEmpty())) words.emplace(w);
  }
  int applied = 0, ties = 0;
  for (const std::string& w : words) {
    float lattice = 0, nbest = 0;
    if (!encoder.MarginsForTest(w, &lattice, &nbest)) continue;
    ++applied;
    ties += lattice == 0;
    INFO(w);
    if (std::isinf(lattice) || std::isinf(nbest)) {
      CHECK(lattice == nbest);  // one segmentation only
    } else {
      CHECK(std::abs(lattice - nbest) <= 1e-3f);
    }
  }
  CHECK(applied > int(words.size()) * 9 / 10);  // all but non-ASCII words and unknown pieces
  CHECK(ties > 0);                              // "7666" and the like
}

}  // namespace
}  // namespace feedline::text
