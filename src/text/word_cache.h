// SentencePiece encoding through a per-thread cache of words' ids: the same ids as encoding
// the whole document, at a hash lookup per word for the words seen before.
//
// Why it is exact: a document is cut at each single ASCII space between two ASCII graphic
// characters. SentencePiece normalizes such a space to "▁" and leaves its neighbours alone; a
// model trained with whitespace splitting (spm_train's default) has no piece with "▁" past its
// first character, so every piece of the document lies within one such word (with the "▁"
// before it, which the word's own encoding has as its dummy prefix). A word's best
// segmentation is then the same in any document, but for one thing: SentencePiece's Viterbi
// sums float scores along the whole document, so where two segmentations of a word score
// (nearly) alike, as "6" "66" and "66" "6" do, the rounding of the sum before the word picks
// one. So each cached word keeps the margin by which its segmentation beats the next (n-best
// scores), and it is taken from the cache only while that margin exceeds the rounding error
// the words before it allow; otherwise the document is encoded whole.
//
// The cache is used only for models where the above holds (no piece with "▁" inside; "a b"
// encoded as "a" then "b"), and it checks itself: every piece of every encoded word must lie
// within its word, and a sample of documents (the first 64 of each cache, then one in 1,024)
// is encoded whole as well and compared. Any difference turns the cache off for the model, and
// the whole document's encoding is returned. Words with an unknown piece are not cached
// (SentencePiece merges runs of unknown pieces).
//
// Thread safety: Encode may run on many threads at once. Each thread has its own cache (at most
// kMaxWords words); a thread that ends hands it back to the encoder, for the next thread (the
// engine keeps its workers from epoch to epoch, but other callers' threads come and go).
#ifndef FEEDLINE_SRC_TEXT_WORD_CACHE_H_
#define FEEDLINE_SRC_TEXT_WORD_CACHE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "text/sentencepiece_model.h"

namespace feedline::text {

struct WordCacheCounters {
  bool enabled = false;  // false: the model does not split at whitespace, or a check failed
  int64_t documents = 0;
  int64_t words = 0;         // words looked up
  int64_t cached_words = 0;  // of them, found in a cache
};

class WordCachedEncoder {
 public:
  // Words longer than this are encoded every time (rare, and seldom repeated).
  static constexpr size_t kMaxWordBytes = 48;
  // A thread's cache is emptied when it holds more words than this (~10 MiB at most).
  static constexpr size_t kMaxWords = size_t{1} << 17;

  // `use_cache` false: every document goes to SentencePiece whole.
  WordCachedEncoder(std::shared_ptr<const SentencePieceModel> model, bool use_cache);
  ~WordCachedEncoder();

  absl::Status Encode(absl::string_view text, std::vector<int>* ids) const;
  WordCacheCounters counters() const;
  const SentencePieceModel& model() const { return *model_; }

  // For tests: a word's margin (see Margin) from the encoder's own lattice and from
  // SentencePiece's n-best scores; false when the lattice does not apply to the word.
  bool MarginsForTest(absl::string_view word, float* lattice_margin, float* nbest_margin) const;

  struct Entry;
  struct Lattice;
  struct Cache;
  struct Pool;

 private:
  absl::Status EncodeWhole(absl::string_view text, std::vector<int>* ids) const;
  // Counts the document (no word from the cache), then encodes it whole.
  absl::Status Whole(absl::string_view text, std::vector<int>* ids, Cache* c) const;
  void Count(size_t words, int64_t hits, Cache* c) const;
  // A word's best segmentation's score, and its margin over the next (infinite for models
  // without near ties); `ids` (`count`) are its pieces as SentencePiece encoded it.
  absl::Status Margin(absl::string_view word, const int* ids, size_t count, float* score,
                      float* margin) const;
  // Caches the new words among words i..j-1 of `text` (Cache::split), whose pieces are `run`
  // (Cache::begins and ends: their offsets from word i). With `magnitude`, also checks that each
  // word is decided after the words before it (`decided`), adding up their scores. A piece
  // across words turns the cache off.
  absl::Status Learn(absl::string_view text, size_t i, size_t j, const std::vector<int>& run,
                     Cache* c, double* magnitude, bool* decided) const;
  void Disable() const { enabled_.store(false, std::memory_order_relaxed); }

  std::shared_ptr<const SentencePieceModel> model_;
  mutable std::atomic<bool> enabled_{false};
  bool viterbi_ = false;              // a unigram model: near ties depend on the words before
  std::unique_ptr<Lattice> lattice_;  // its pieces, for the margins of ASCII words
  std::shared_ptr<Pool> pool_;
  mutable std::atomic<int64_t> documents_{0}, words_{0}, cached_words_{0};
};

}  // namespace feedline::text

#endif  // FEEDLINE_SRC_TEXT_WORD_CACHE_H_
