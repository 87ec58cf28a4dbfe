#include "text/word_cache.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace feedline::text {

namespace {

// A word: text[begin, end), between safe spaces (see word_cache.h).
struct Word {
  uint32_t begin, end;
};

bool Graphic(char c) { return c > 0x20 && c < 0x7F; }

constexpr absl::string_view kSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Cuts `text` at each single ASCII space between two ASCII graphic characters.
void SplitWords(absl::string_view text, std::vector<Word>* words) {
  words->clear();
  const char* p = text.data();
  const size_t n = text.size();
  size_t start = 0, i = 0;
  while (i < n) {
    const void* q = std::memchr(p + i, ' ', n - i);
    if (q == nullptr) break;
    const size_t s = size_t(static_cast<const char*>(q) - p);
    if (s > 0 && s + 1 < n && Graphic(p[s - 1]) && Graphic(p[s + 1])) {
      words->push_back({uint32_t(start), uint32_t(s)});
      start = s + 1;
    }
    i = s + 1;
  }
  words->push_back({uint32_t(start), uint32_t(n)});
}

// Documents a cache checks against the whole document's encoding: its first kFirstChecked, then
// one in kCheckEvery.
constexpr int64_t kFirstChecked = 64;
constexpr int64_t kCheckEvery = 1024;
// A document with more than 1 / kWholeAbove of its words not cached goes to SentencePiece
// whole, rather than in runs of new words.
constexpr size_t kWholeAbove = 5;
// A cache is also emptied past this many cached ids.
constexpr size_t kMaxIds = size_t{1} << 20;

// Whether a word whose best segmentation beats the next by `margin` (the word alone: its
// lattice's two best paths) is segmented the same way after words whose scores add up to
// `before` in magnitude. SentencePiece's Viterbi adds float scores along the document: each sum
// is off by up to 2^-24 of its magnitude, so two segmentations of the word compare as they do
// alone while their margin exceeds twice the sums' error over the word's pieces (at most one per
// byte, and the dummy prefix). With a factor 4 besides, for the scores' own rounding. A tie
// (margin 0, as "6" "66" against "66" "6") is never decided alone.
bool Decided(float margin, double before, float score, size_t bytes) {
  const double error = double(bytes + 2) * 0x1.0p-24 * (before + std::abs(score) + 1);
  return margin > 8 * error;
}

absl::Status SentencePieceError(const std::string& error) {
  return absl::InternalError(absl::StrCat("SentencePiece: ", error));
}

}  // namespace

struct WordCachedEncoder::Entry {
  uint32_t first, count;  // the word's ids: Cache::ids[first, first + count)
  float score;            // its segmentation's score (the sum of its pieces')
  float margin;           // less the second-best segmentation's (0: a tie; NaN: not known yet)
};

struct WordCachedEncoder::Cache {
  absl::flat_hash_map<std::string, Entry> words;
  std::vector<int> ids;
  int64_t documents = 0;
  // Scratch, kept between documents.
  std::vector<Word> split;
  std::vector<Entry*> found;  // each word's entry, or null
  // New words of the document, added to `words` once it is encoded (`found` points into it).
  std::vector<std::pair<Word, Entry>> learnt;
  std::vector<int> run_ids, whole;
  std::vector<uint32_t> begins, ends;
};

struct WordCachedEncoder::Lattice {
  static constexpr double kNone = -std::numeric_limits<double>::infinity();
  struct Node {
    double best = kNone, second = kNone;
    size_t from = 0;  // the best path's last piece: s[from, here), `id`
    int id = -1;
  };
  absl::flat_hash_map<std::string, std::pair<int, float>> pieces;  // piece -> id, score
  size_t longest = 0;                                              // bytes
  float unknown_score = 0;

  // SentencePiece's unigram lattice of a word of ASCII graphic characters (which normalize to
  // themselves) after its "▁": the scores of the best and second-best segmentations, by dynamic
  // programming over the two best paths into each position. False when the word is not such,
  // or its best path is not `ids` (SentencePiece's: then its normalization is not the identity
  // on it, and n-best scores decide).
  bool TwoBest(absl::string_view word, const int* ids, size_t count, float* score,
               float* margin) const {
    for (char ch : word) {
      if (!Graphic(ch)) return false;
    }
    std::string s(kSpace);
    s.append(word.data(), word.size());
    const size_t n = s.size();
    thread_local std::vector<Node> nodes;
    nodes.assign(n + 1, Node{});
    nodes[0].best = 0;
    auto reach = [&](size_t from, size_t to, int id, double score) {
      Node& t = nodes[to];
      const double a = nodes[from].best + score, b = nodes[from].second + score;
      if (a > t.best) {
        t.second = std::max(t.best, b);
        t.best = a;
        t.from = from;
        t.id = id;
      } else {
        t.second = std::max(t.second, a);
      }
    };
    for (size_t at = 0; at < n; at = at == 0 ? kSpace.size() : at + 1) {
      if (nodes[at].best == kNone) continue;
      const size_t one = at == 0 ? kSpace.size() : 1;  // the character here, in bytes
      bool single = false;
      for (size_t len = one; len <= longest && at + len <= n; ++len) {
        auto it = pieces.find(absl::string_view(s).substr(at, len));
        if (it == pieces.end()) continue;
        reach(at, at + len, it->second.first, it->second.second);
        single = single || len == one;
      }
      if (!single) reach(at, at + one, -1, unknown_score);
    }
    // The best path, backwards, against SentencePiece's.
    size_t k = count, at = n;
    while (at > 0) {
      if (k == 0 || nodes[at].id != ids[k - 1]) return false;
      at = nodes[at].from;
      --k;
    }
    if (k != 0) return false;
    *score = float(nodes[n].best);
    *margin = float(nodes[n].best - nodes[n].second);
    return true;
  }
};

struct WordCachedEncoder::Pool {
  std::mutex mu;
  std::vector<std::unique_ptr<Cache>> idle;  // caches of threads that ended
};

namespace {

// A thread's cache, for the encoder (pool) it last worked for.
struct ThreadSlot {
  std::shared_ptr<WordCachedEncoder::Pool> pool;
  std::unique_ptr<WordCachedEncoder::Cache> cache;
  void Release() {
    if (pool != nullptr && cache != nullptr) {
      std::lock_guard<std::mutex> lock(pool->mu);
      pool->idle.push_back(std::move(cache));
    }
    pool.reset();
    cache.reset();
  }
  ~ThreadSlot() { Release(); }
};

WordCachedEncoder::Cache* ThreadCache(const std::shared_ptr<WordCachedEncoder::Pool>& pool) {
  thread_local ThreadSlot slot;
  if (slot.pool != pool) {
    slot.Release();
    slot.pool = pool;
    {
      std::lock_guard<std::mutex> lock(pool->mu);
      if (!pool->idle.empty()) {
        slot.cache = std::move(pool->idle.back());
        pool->idle.pop_back();
      }
    }
    if (slot.cache == nullptr) slot.cache = std::make_unique<WordCachedEncoder::Cache>();
  }
  return slot.cache.get();
}

// Whether the model's pieces never hold "▁" past their first character (spm_train's
// --split_by_whitespace, the default), and "a b" encodes as "a" then "b".
bool SplitsAtWhitespace(const SentencePieceModel& m) {
  for (int id = 0; id < m.vocab_size(); ++id) {
    const std::string& piece = m.IdToPiece(id);
    if (piece.size() > kSpace.size() &&
        absl::string_view(piece).find(kSpace, 1) != absl::string_view::npos) {
      return false;
    }
  }
  std::vector<int> whole, a, b;
  std::string error;
  for (const auto& [text, first, second] :
       {std::tuple<const char*, const char*, const char*>{"a b", "a", "b"},
        {"The cat, sat.", "The", "cat, sat."},
        {"x 0", "x", "0"}}) {
    if (!m.Encode(text, &whole, &error) || !m.Encode(first, &a, &error) ||
        !m.Encode(second, &b, &error)) {
      return false;
    }
    a.insert(a.end(), b.begin(), b.end());
    if (a != whole) return false;
  }
  return true;
}

}  // namespace

WordCachedEncoder::WordCachedEncoder(std::shared_ptr<const SentencePieceModel> model,
                                     bool use_cache)
    : model_(std::move(model)), pool_(std::make_shared<Pool>()) {
  enabled_.store(use_cache && SplitsAtWhitespace(*model_));
  // Only unigram models have n-best scores, and ties decided by float sums; BPE merges by the
  // pieces' order, word and char models split plainly: a word is segmented alike everywhere.
  float best, second;
  std::string error;
  viterbi_ = model_->TwoBestScores("a", &best, &second, &error);
  if (!viterbi_ || !enabled_.load()) return;
  // The pieces text can match, for the margins of ASCII words (Margin). A normal piece scored
  // >= 0 is taken for a user-defined one, which SentencePiece scores by its length instead:
  // n-best scores then.
  lattice_ = std::make_unique<Lattice>();
  float min_score = std::numeric_limits<float>::infinity();
  for (int id = 0; id < model_->vocab_size(); ++id) {
    if (!model_->IsNormal(id)) continue;
    const float score = model_->Score(id);
    if (!(score < 0)) {
      lattice_.reset();
      return;
    }
    min_score = std::min(min_score, score);
    const std::string& piece = model_->IdToPiece(id);
    lattice_->pieces.try_emplace(piece, id, score);
    lattice_->longest = std::max(lattice_->longest, piece.size());
  }
  lattice_->unknown_score = min_score - 10;  // SentencePiece's kUnkPenalty
}

WordCachedEncoder::~WordCachedEncoder() = default;

WordCacheCounters WordCachedEncoder::counters() const {
  WordCacheCounters c;
  c.enabled = enabled_.load(std::memory_order_relaxed);
  c.documents = documents_.load(std::memory_order_relaxed);
  c.words = words_.load(std::memory_order_relaxed);
  c.cached_words = cached_words_.load(std::memory_order_relaxed);
  return c;
}

absl::Status WordCachedEncoder::EncodeWhole(absl::string_view text, std::vector<int>* ids) const {
  std::string error;
  if (!model_->Encode(std::string_view(text.data(), text.size()), ids, &error)) {
    return SentencePieceError(error);
  }
  return absl::OkStatus();
}

absl::Status WordCachedEncoder::Encode(absl::string_view text, std::vector<int>* ids) const {
  if (!enabled_.load(std::memory_order_relaxed)) return EncodeWhole(text, ids);
  Cache& c = *ThreadCache(pool_);
  if (c.words.size() > kMaxWords || c.ids.size() > kMaxIds) {
    c.words.clear();
    c.ids.clear();
  }
  struct AddLearnt {  // at every return
    Cache& c;
    absl::string_view text;
    ~AddLearnt() {
      for (const auto& [w, e] : c.learnt) {
        c.words.try_emplace(std::string(text.substr(w.begin, w.end - w.begin)), e);
      }
      c.learnt.clear();
    }
  } add_learnt{c, text};
  SplitWords(text, &c.split);
  const std::vector<Word>& w = c.split;
  // Each word's entry, or null: looked up before any word is added (entries do not move then).
  c.found.clear();
  size_t misses = 0;
  for (const Word& word : w) {
    const uint32_t len = word.end - word.begin;
    Entry* e = nullptr;
    if (len <= kMaxWordBytes) {
      auto it = c.words.find(text.substr(word.begin, len));
      if (it != c.words.end()) e = &it->second;
    }
    c.found.push_back(e);
    misses += e == nullptr;
  }
  std::string error;
  if (misses * kWholeAbove > w.size()) {
    // Mostly new words (a cold cache): SentencePiece on the whole document, one call, and its
    // pieces teach the cache the new words.
    if (!model_->EncodeWithOffsets(std::string_view(text.data(), text.size()), ids, &c.begins,
                                   &c.ends, &error)) {
      return SentencePieceError(error);
    }
    Count(w.size(), 0, &c);
    bool decided = true;
    return Learn(text, 0, w.size(), *ids, &c, nullptr, &decided);
  }
  ids->clear();
  int64_t hits = 0;
  double magnitude = 0;  // of the Viterbi score before the word: the sum of the words' scores
  for (size_t i = 0; i < w.size();) {
    if (Entry* e = c.found[i]) {
      if (std::isnan(e->margin)) {
        absl::Status s = Margin(text.substr(w[i].begin, w[i].end - w[i].begin),
                                c.ids.data() + e->first, e->count, &e->score, &e->margin);
        if (!s.ok()) return s;
      }
      if (!Decided(e->margin, magnitude, e->score, w[i].end - w[i].begin)) {
        return Whole(text, ids, &c);  // a near tie: its pieces depend on the words before
      }
      ids->insert(ids->end(), c.ids.begin() + e->first, c.ids.begin() + e->first + e->count);
      magnitude += std::abs(e->score);
      ++hits;
      ++i;
      continue;
    }
    // Words i..j-1 are not cached: encode them together, and cache each one's pieces.
    size_t j = i + 1;
    while (j < w.size() && c.found[j] == nullptr) ++j;
    const uint32_t base = w[i].begin;
    if (!model_->EncodeWithOffsets(std::string_view(text.data() + base, w[j - 1].end - base),
                                   &c.run_ids, &c.begins, &c.ends, &error)) {
      return SentencePieceError(error);
    }
    bool decided = true;
    if (absl::Status s = Learn(text, i, j, c.run_ids, &c, &magnitude, &decided); !s.ok()) {
      return s;
    }
    if (!enabled_.load(std::memory_order_relaxed)) return EncodeWhole(text, ids);
    if (!decided) return Whole(text, ids, &c);
    ids->insert(ids->end(), c.run_ids.begin(), c.run_ids.end());
    i = j;
  }
  Count(w.size(), hits, &c);
  if (c.documents <= kFirstChecked || c.documents % kCheckEvery == 0) {
    if (absl::Status s = EncodeWhole(text, &c.whole); !s.ok()) return s;
    if (c.whole != *ids) {
      Disable();
      ids->swap(c.whole);
    }
  }
  return absl::OkStatus();
}

absl::Status WordCachedEncoder::Learn(absl::string_view text, size_t i, size_t j,
                                      const std::vector<int>& run, Cache* c, double* magnitude,
                                      bool* decided) const {
  const std::vector<Word>& w = c->split;
  const uint32_t base = w[i].begin;
  size_t p = 0;
  for (size_t k = i; k < j; ++k) {
    // Word k's pieces: those starting at its separating space (k > i) or within it, ending
    // within it.
    const uint32_t lo = k == i ? 0 : w[k].begin - 1 - base, hi = w[k].end - base;
    const size_t first = p;
    bool unknown = false;
    for (; p < run.size() && c->begins[p] < hi; ++p) {
      if (c->begins[p] < lo || c->ends[p] > hi) {
        Disable();  // a piece across words: this model's pieces depend on their neighbours
        return absl::OkStatus();
      }
      unknown = unknown || model_->IsUnknown(run[p]);
    }
    const absl::string_view word = text.substr(w[k].begin, w[k].end - w[k].begin);
    const bool new_word = c->found[k] == nullptr && !unknown && word.size() <= kMaxWordBytes;
    // Without `magnitude` (the whole document encoded), the output needs no check, and a new
    // word's margin waits until the word is met again (most words met once never are).
    float best = 0, margin = std::numeric_limits<float>::quiet_NaN();
    if (magnitude != nullptr) {
      if (absl::Status s = Margin(word, run.data() + first, p - first, &best, &margin); !s.ok()) {
        return s;
      }
      *decided = *decided && Decided(margin, *magnitude, best, word.size());
      *magnitude += std::abs(best);
    }
    if (new_word) {
      c->learnt.push_back(
          {w[k], Entry{uint32_t(c->ids.size()), uint32_t(p - first), best, margin}});
      c->ids.insert(c->ids.end(), run.begin() + first, run.begin() + p);
    }
  }
  if (p != run.size()) Disable();
  return absl::OkStatus();
}

absl::Status WordCachedEncoder::Margin(absl::string_view word, const int* ids, size_t count,
                                       float* score, float* margin) const {
  if (viterbi_ && lattice_ != nullptr && lattice_->TwoBest(word, ids, count, score, margin)) {
    return absl::OkStatus();
  }
  float best = 0, second = -std::numeric_limits<float>::infinity();
  std::string error;
  if (viterbi_ &&
      !model_->TwoBestScores(std::string_view(word.data(), word.size()), &best, &second, &error)) {
    return SentencePieceError(error);
  }
  *score = best;
  *margin = best - second;
  return absl::OkStatus();
}

bool WordCachedEncoder::MarginsForTest(absl::string_view word, float* lattice_margin,
                                       float* nbest_margin) const {
  std::vector<int> ids;
  std::string error;
  if (lattice_ == nullptr ||
      !model_->Encode(std::string_view(word.data(), word.size()), &ids, &error)) {
    return false;
  }
  float score, best, second;
  if (!lattice_->TwoBest(word, ids.data(), ids.size(), &score, lattice_margin)) return false;
  if (!model_->TwoBestScores(std::string_view(word.data(), word.size()), &best, &second, &error)) {
    return false;
  }
  *nbest_margin = best - second;
  return true;
}

absl::Status WordCachedEncoder::Whole(absl::string_view text, std::vector<int>* ids,
                                      Cache* c) const {
  Count(c->split.size(), 0, c);
  return EncodeWhole(text, ids);
}

void WordCachedEncoder::Count(size_t words, int64_t hits, Cache* c) const {
  ++c->documents;
  documents_.fetch_add(1, std::memory_order_relaxed);
  words_.fetch_add(int64_t(words), std::memory_order_relaxed);
  cached_words_.fetch_add(hits, std::memory_order_relaxed);
}

}  // namespace feedline::text
