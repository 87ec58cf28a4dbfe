// feedline-bench --compare-text: the text workloads on a bundled corpus (made once: 20,000
// documents with long-tailed lengths, a SentencePiece model trained on it with spm_train), in
// one run:
//   tokenizer limit   single-thread C++ SentencePiece encode of every document, x cores
//   feedline padded   documents tokenized in feedline's workers, padded per batch (batch 32)
//   feedline concat   packed rows (seq_len 2048, 8 rows a batch), documents joined with EOS
//   feedline bestfit  packed rows of whole documents, best fit per window of 1024
//   concat, no cache  feedline concat with SentencePiece alone (no word cache): the pipeline's
//                     own efficiency against the limit
//   torch DataLoader  Python sentencepiece in the workers and a padding collate (batch 32), one
//                     process per worker count tried (bench/peer_text.py), best kept
// Each reports real tokens/s, CPU per token, packing efficiency (real tokens / slots) and peak
// memory (feedline: this process; torch: its process tree).
#ifndef FEEDLINE_BENCH_TEXT_BENCH_H_
#define FEEDLINE_BENCH_TEXT_BENCH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench_util.h"

namespace feedline::bench {

struct TextCompareOptions {
  std::string data_dir;  // where the corpus and the model are (made there once)
  int epochs = 3;        // figures over epochs 2..epochs
  std::vector<int> torch_workers;
  std::string python, script_dir, pythonpath;
  bool quiet = false;
};

struct TextContender {
  std::string name;
  int workers = 0;
  double tokens_per_s = 0;
  double cpu_us_per_token = 0;
  double efficiency = 0;  // real tokens / slots of the batches
  int64_t peak_bytes = 0;
  // feedline's: the tokenizer limit measured right before and after this contender (mean;
  // tokens/s, x cores), its ratio's denominator: the machine's speed drifts within a run.
  double limit = 0;
  double ratio_to_limit() const { return limit > 0 ? tokens_per_s / limit : 0; }
  // feedline's: the words its tokenizer looked up over the measured epochs, and of them the
  // ones found in its word cache (0 and 0 without the cache).
  int64_t words = 0, cached_words = 0;
  // feedline's first epoch (not in the figures above): its tokens/s and words, with the word
  // cache cold, as a run over a corpus larger than the cache keeps meeting new words.
  double first_epoch_tokens_per_s = 0;
  int64_t first_epoch_words = 0, first_epoch_cached_words = 0;
};

struct TextCompareResult {
  int64_t documents = 0, tokens = 0;        // the corpus (tokens: without BOS/EOS)
  double limit_one_thread = 0, limit = 0;   // tokens/s, the mean of the measurements
  double limit_all_threads = 0;             // every core encoding at once
  double all_threads_cpu_us_per_token = 0;  // and the CPU each token took then
  std::vector<TextContender> contenders;    // feedline's, then torch's
  TextContender best_torch;
  double padded_vs_torch = 0, padded_vs_limit = 0;
};

absl::StatusOr<TextCompareResult> RunTextComparison(const TextCompareOptions& options);
// The bundled corpus (corpus.txt: long-tailed documents, one a line) and its SentencePiece
// model (m.model, trained by Debian's spm_train) in `data_dir`, made when missing.
absl::Status EnsureCorpus(const std::string& data_dir, bool quiet);
void WriteTextJson(const TextCompareResult& result, JsonWriter& json);

}  // namespace feedline::bench

#endif  // FEEDLINE_BENCH_TEXT_BENCH_H_
