#include "text_bench.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "feedline/loader.h"
#include "feedline/text.h"
#include "process_tree.h"

namespace feedline::bench {
namespace {

namespace fs = std::filesystem;
constexpr int kDocuments = 20000;
constexpr int64_t kMaxLength = 2048;
constexpr int64_t kSeqLen = 2048;

// A long-tailed corpus: word counts log-normal (median 20, a few thousand at most), words drawn
// Zipf-like (s = 1, as in English text) over a list of common English words, 200,000 made-up
// ones (1 to 4 syllables: at most 54,240 distinct, so many recur in the list) and some
// non-ASCII ones, with commas, full stops and capitals after them, and numbers: ~45,000 distinct
// words in all, so that a word cache meets as many new words as in natural text of this size
// (version 1 had 580 distinct words: every word was cached after a few documents).
std::string MakeCorpus() {
  std::mt19937_64 rng(20261203);
  auto uniform = [&rng] { return double(rng() >> 11) * 0x1.0p-53; };
  std::vector<std::string> words = {
      "the",  "of",   "and",   "to",     "in",    "a",      "is",     "that",   "for",
      "it",   "as",   "was",   "with",   "be",    "by",     "on",     "not",    "he",
      "this", "are",  "or",    "his",    "from",  "at",     "which",  "but",    "have",
      "an",   "they", "you",   "were",   "her",   "she",    "there",  "been",   "one",
      "all",  "we",   "their", "has",    "would", "loader", "batch",  "tensor", "gradient",
      "über", "café", "naïve", "straße", "東京",  "データ", "ünïcödé"};
  const char* syllables[] = {"ka",  "lo", "mi", "ren", "sta", "qu",  "ar", "on",
                             "tel", "vi", "do", "ze",  "pha", "gri", "ul"};
  for (int i = 0; i < 200000; ++i) {
    std::string w;
    for (int k = 1 + int(rng() % 4); k > 0; --k) w += syllables[rng() % 15];
    words.push_back(w);
  }
  std::vector<double> cumulative;
  double sum = 0;
  for (size_t i = 0; i < words.size(); ++i) cumulative.push_back(sum += 1.0 / double(i + 1));
  std::string out;
  for (int d = 0; d < kDocuments; ++d) {
    const double z = std::sqrt(-2 * std::log(1 - uniform())) * std::cos(2 * M_PI * uniform());
    const int n = 1 + int(std::min(3000.0, std::exp(3.0 + 1.0 * z)));
    bool capital = true;
    for (int k = 0; k < n; ++k) {
      if (k > 0) out += ' ';
      const double kind = uniform();
      if (kind < 0.01) {
        out += std::to_string(rng() % 100000);
      } else {
        const double u = uniform() * sum;
        std::string w = words[std::min(
            size_t(std::lower_bound(cumulative.begin(), cumulative.end(), u) - cumulative.begin()),
            words.size() - 1)];
        if (capital && w[0] >= 'a' && w[0] <= 'z') w[0] = char(w[0] - 'a' + 'A');
        out += w;
      }
      capital = false;
      if (kind > 0.95) {
        out += ',';
      } else if (kind > 0.91) {
        out += '.';
        capital = true;
      }
    }
    out += '\n';
  }
  return out;
}

// `name` in $PATH (RunChild takes a path).
std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view d : absl::StrSplit(path != nullptr ? path : "/usr/bin:/bin", ':')) {
    const fs::path p = fs::path(std::string(d)) / name;
    if (::access(p.c_str(), X_OK) == 0) return p.string();
  }
  return name;
}

std::vector<std::string> Lines(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) out.push_back(line);
  }
  return out;
}

// A feedline epoch of the bundled corpus lasts ~0.1 s: measured over two, the figures were a
// fifth of a second, epoch starts and ends (the last chunks on one worker) a tenth of it, and
// the machine's jitter the rest. So each contender runs at least `epochs` epochs and at least
// this long after its warm-up epoch, and the limit is timed over as long: steady-state rates,
// as a training run over a real corpus sees them.
constexpr double kMinMeasuredSeconds = 1.5;

// Epochs of `run_epoch` (returns {real tokens, slots}); figures over the epochs after the first
// (at least `epochs - 1` of them, and kMinMeasuredSeconds).
template <typename RunEpoch>
TextContender Measure(std::string name, int epochs, const text::Tokenizer& tokenizer,
                      RunEpoch run_epoch) {
  TextContender c;
  c.name = std::move(name);
  const text::Tokenizer::Counters start = tokenizer.counters();
  const Clock::time_point t_first = Clock::now();
  c.first_epoch_tokens_per_s = double(run_epoch().first) / SecondsSince(t_first);
  const text::Tokenizer::Counters before = tokenizer.counters();
  c.first_epoch_words = before.words - start.words;
  c.first_epoch_cached_words = before.cached_words - start.cached_words;
  const double cpu0 = CpuSeconds();
  const Clock::time_point t0 = Clock::now();
  int64_t tokens = 0, slots = 0;
  for (int e = 1; e < epochs || SecondsSince(t0) < kMinMeasuredSeconds; ++e) {
    auto [t, s] = run_epoch();
    tokens += t;
    slots += s;
  }
  const double wall = SecondsSince(t0);
  c.tokens_per_s = double(tokens) / wall;
  c.cpu_us_per_token = (CpuSeconds() - cpu0) * 1e6 / double(std::max<int64_t>(tokens, 1));
  c.efficiency = slots > 0 ? double(tokens) / double(slots) : 0;
  c.peak_bytes = PeakRssBytes();
  const text::Tokenizer::Counters after = tokenizer.counters();
  c.words = after.words - before.words;
  c.cached_words = after.cached_words - before.cached_words;
  return c;
}

std::map<std::string, std::string> Fields(const std::string& line) {
  std::map<std::string, std::string> out;
  for (absl::string_view w : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    const size_t eq = w.find('=');
    if (eq != absl::string_view::npos)
      out[std::string(w.substr(0, eq))] = std::string(w.substr(eq + 1));
  }
  return out;
}

absl::StatusOr<TextContender> RunPeer(const TextCompareOptions& o, const fs::path& dir, int w) {
  std::vector<std::string> argv = {o.python,    (fs::path(o.script_dir) / "peer_text.py").string(),
                                   "--corpus",  (dir / "corpus.txt").string(),
                                   "--model",   (dir / "m.model").string(),
                                   "--workers", absl::StrCat(w),
                                   "--epochs",  absl::StrCat(o.epochs)};
  absl::StatusOr<ChildRun> run = RunChild(argv, {"PYTHONDONTWRITEBYTECODE=1", "PYTHONUNBUFFERED=1"},
                                          std::chrono::milliseconds(200));
  if (!run.ok()) return run.status();
  if (run->exit_code != 0) {
    return absl::InternalError(absl::StrCat(absl::StrJoin(argv, " "), " exited with status ",
                                            run->exit_code, " (its messages are above)"));
  }
  TextContender c;
  c.name = "torch DataLoader";
  c.workers = w;
  double seconds = 0, cpu = 0;
  int64_t tokens = 0, slots = 0;
  int epochs = 0;
  for (const std::string& line : run->stdout_lines) {
    if (line.rfind("epoch ", 0) != 0) continue;
    std::map<std::string, std::string> f = Fields(line);
    int64_t index = 0, t = 0, s = 0;
    double sec = 0, c_s = 0;
    if (!absl::SimpleAtoi(f["index"], &index) || !absl::SimpleAtoi(f["tokens"], &t) ||
        !absl::SimpleAtoi(f["slots"], &s) || !absl::SimpleAtod(f["seconds"], &sec) ||
        !absl::SimpleAtod(f["cpu_seconds"], &c_s)) {
      return absl::InternalError(absl::StrCat("peer_text.py: unreadable line '", line, "'"));
    }
    ++epochs;
    if (index == 0) continue;  // warm-up, as for feedline
    tokens += t;
    slots += s;
    seconds += sec;
    cpu += c_s;
  }
  if (epochs != o.epochs) {
    return absl::InternalError(absl::StrCat("peer_text.py: ", epochs, " epochs reported"));
  }
  c.tokens_per_s = double(tokens) / seconds;
  c.cpu_us_per_token = cpu * 1e6 / double(std::max<int64_t>(tokens, 1));
  c.efficiency = slots > 0 ? double(tokens) / double(slots) : 0;
  c.peak_bytes = run->memory.peak_bytes();
  return c;
}

}  // namespace

absl::Status EnsureCorpus(const std::string& data_dir, bool quiet) {
  const fs::path dir = data_dir;
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path corpus = dir / "corpus.txt", model = dir / "m.model";
  if (!fs::exists(corpus)) {
    if (!quiet) std::fprintf(stderr, "feedline-bench: making the text corpus in %s\n", dir.c_str());
    const fs::path tmp = dir / "corpus.txt.tmp";
    std::ofstream(tmp, std::ios::binary) << MakeCorpus();
    fs::rename(tmp, corpus, ec);
    if (ec) return absl::InternalError(absl::StrCat(corpus.string(), ": ", ec.message()));
  }
  if (!fs::exists(model)) {
    absl::StatusOr<ChildRun> run = RunChild(
        {FindInPath("spm_train"), "--input=" + corpus.string(),
         "--model_prefix=" + (dir / "m").string(), "--vocab_size=2000", "--hard_vocab_limit=false",
         "--pad_id=3", "--character_coverage=1.0", "--minloglevel=2"},
        {}, std::chrono::milliseconds(1000));
    if (!run.ok()) return run.status();
    if (run->exit_code != 0) {
      return absl::FailedPreconditionError(
          "spm_train failed (Debian's sentencepiece package: cmake/install-deps.sh installs it)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TextCompareResult> RunTextComparison(const TextCompareOptions& o) {
  const fs::path dir = o.data_dir;
  if (absl::Status s = EnsureCorpus(dir, o.quiet); !s.ok()) return s;
  const std::string corpus = (dir / "corpus.txt").string(), model = (dir / "m.model").string();
  // feedline's tokenizer (with its word cache: loaded anew for each contender, so that each
  // starts cold), and SentencePiece alone: the limit's.
  auto cached = [&]() { return text::LoadSentencePiece(model); };
  absl::StatusOr<std::shared_ptr<const text::Tokenizer>> tokenizer = cached();
  if (!tokenizer.ok()) return tokenizer.status();
  text::SentencePieceOptions no_cache;
  no_cache.word_cache = false;
  absl::StatusOr<std::shared_ptr<const text::Tokenizer>> sentencepiece =
      text::LoadSentencePiece(model, no_cache);
  if (!sentencepiece.ok()) return sentencepiece.status();
  TextCompareResult r;
  std::printf(
      "feedline-bench --compare-text: %d documents (long-tailed), SentencePiece model from "
      "spm_train, >= %d epochs per contender (figures over the epochs after the first, "
      ">= %.1f s), %d cores\n",
      kDocuments, o.epochs, kMinMeasuredSeconds, Cores());
  std::fflush(stdout);

  // The tokenizer limit: one thread encoding every document, as the workers do. Measured
  // again after each feedline contender: each one's ratio is to the mean of the measurements
  // right before and after it (this shared machine's speed drifts by 10-30% within a run).
  const std::vector<std::string> docs = Lines(corpus);
  r.documents = int64_t(docs.size());
  std::vector<double> limits;  // one thread, tokens/s
  auto measure_limit = [&]() -> absl::Status {
    std::vector<int> ids;
    int64_t tokens = 0;
    const Clock::time_point t0 = Clock::now();
    do {  // whole passes over the corpus, for a third of a contender's time at least
      int64_t pass = 0;
      for (const std::string& d : docs) {
        if (!(*sentencepiece)->Encode(d, &ids).ok()) return absl::InternalError("encode failed");
        pass += int64_t(ids.size());
      }
      tokens += pass;
      r.tokens = pass;
    } while (SecondsSince(t0) < kMinMeasuredSeconds / 3);
    limits.push_back(double(tokens) / SecondsSince(t0));
    return absl::OkStatus();
  };
  auto around = [&](TextContender* c) -> absl::Status {  // after c ran
    if (absl::Status s = measure_limit(); !s.ok()) return s;
    c->limit = 0.5 * (limits[limits.size() - 2] + limits.back()) * Cores();
    return absl::OkStatus();
  };
  if (absl::Status s = measure_limit(); !s.ok()) return s;
  {
    // Beside it, what the cores give when they all encode at once (shared caches, clocks).
    // Whole passes (each thread its share of the documents) until a third of a contender's time.
    std::vector<std::thread> threads;
    std::vector<int64_t> counted(size_t(Cores()), 0);
    const double cpu1 = CpuSeconds();
    const Clock::time_point t1 = Clock::now();
    for (int c = 0; c < Cores(); ++c) {
      threads.emplace_back([&, c] {
        std::vector<int> mine;
        int64_t n = 0;  // a local: neighbouring counters share a cache line
        do {
          for (size_t i = size_t(c); i < docs.size(); i += size_t(Cores())) {
            (void)(*sentencepiece)->Encode(docs[i], &mine);
            n += int64_t(mine.size());
          }
        } while (SecondsSince(t1) < kMinMeasuredSeconds / 3);
        counted[size_t(c)] = n;
      });
    }
    for (std::thread& t : threads) t.join();
    const double seconds = SecondsSince(t1);
    int64_t all = 0;
    for (int64_t n : counted) all += n;
    r.limit_all_threads = double(all) / seconds;
    r.all_threads_cpu_us_per_token =
        (CpuSeconds() - cpu1) * 1e6 / double(std::max<int64_t>(all, 1));
  }

  auto document_loader = [&](bool ragged, int64_t batch,
                             const std::shared_ptr<const text::Tokenizer>& tok)
      -> absl::StatusOr<std::unique_ptr<Loader>> {
    auto docs = text::OpenTextLines({corpus, ""});
    if (!docs.ok()) return docs.status();
    text::TokenizeOptions t;
    t.tokenizer = tok;
    t.max_length = ragged ? 65536 : kMaxLength;
    t.add_eos = ragged;
    t.ragged = ragged;
    auto transform = text::MakeTokenizeTransform(t);
    if (!transform.ok()) return transform.status();
    return Loader::Create(*docs, *transform, LoaderOptions().batch_size(batch).seed(1));
  };
  {
    absl::StatusOr<std::unique_ptr<Loader>> loader = document_loader(false, 32, *tokenizer);
    if (!loader.ok()) return loader.status();
    TextContender c = Measure("feedline padded", o.epochs, **tokenizer, [&] {
      int64_t tokens = 0, slots = 0;
      for (auto& b : **loader) {
        if (!b.ok()) continue;
        const TensorView v = b->field("input_ids");
        for (int64_t i = 0; i < b->size(); ++i) tokens += v.lengths[i];
        slots += v.elements();
      }
      return std::make_pair(tokens, slots);
    });
    c.workers = (*loader)->stats().workers;
    if (absl::Status s = around(&c); !s.ok()) return s;
    r.contenders.push_back(c);
  }
  struct Packed {
    const char* name;
    text::PackMode mode;
    std::shared_ptr<const text::Tokenizer> tokenizer;
  };
  for (const Packed& k : {Packed{"feedline concat", text::PackMode::kConcat, *cached()},
                          Packed{"feedline bestfit", text::PackMode::kBestFit, *cached()},
                          Packed{"concat, no cache", text::PackMode::kConcat, *sentencepiece}}) {
    absl::StatusOr<std::unique_ptr<Loader>> docs = document_loader(true, 64, k.tokenizer);
    if (!docs.ok()) return docs.status();
    text::PackOptions p;
    p.mode = k.mode;
    p.seq_len = kSeqLen;
    p.batch_size = 8;
    p.pad_id = std::max((*tokenizer)->pad_id(), 0);
    auto packed = text::PackedLoader::Create(*std::move(docs), p);
    if (!packed.ok()) return packed.status();
    TextContender c = Measure(k.name, o.epochs, *k.tokenizer, [&] {
      int64_t tokens = 0, slots = 0;
      auto epoch = (*packed)->StartEpoch();
      for (;;) {
        absl::StatusOr<Batch> b = epoch->Next();
        if (!b.ok()) break;
        const TensorView mask = b->field("attention_mask");
        const auto* m = static_cast<const int64_t*>(mask.data);
        for (int64_t i = 0; i < mask.elements(); ++i) tokens += m[i];
        slots += mask.elements();
      }
      return std::make_pair(tokens, slots);
    });
    c.workers = (*packed)->documents().stats().workers;
    if (absl::Status s = around(&c); !s.ok()) return s;
    r.contenders.push_back(c);
  }
  for (int w : o.torch_workers) {
    absl::StatusOr<TextContender> c = RunPeer(o, dir, w);
    if (!c.ok()) return c.status();
    if (c->tokens_per_s > r.best_torch.tokens_per_s) r.best_torch = *c;
    r.contenders.push_back(*c);
  }
  const TextContender& padded = r.contenders[0];
  r.padded_vs_torch =
      r.best_torch.tokens_per_s > 0 ? padded.tokens_per_s / r.best_torch.tokens_per_s : 0;
  double sum = 0;
  for (double l : limits) sum += l;
  r.limit_one_thread = sum / double(limits.size());
  r.limit = r.limit_one_thread * Cores();
  r.padded_vs_limit = padded.ratio_to_limit();

  std::printf("\n  %-18s %8s %12s %14s %11s %10s\n", "contender", "workers", "M tokens/s",
              "CPU us/token", "efficiency", "peak MiB");
  std::printf("  %-18s %8d %12.2f %14.3f %11s %10s  (mean of %zu; %s M tokens/s)\n",
              "tokenizer limit", Cores(), r.limit / 1e6, 1e6 / r.limit_one_thread, "-", "-",
              limits.size(), absl::StrJoin(limits, " ", [](std::string* out, double l) {
                               absl::StrAppend(out, absl::StrFormat("%.2f", l * Cores() / 1e6));
                             }).c_str());
  std::printf("  %-18s %8d %12.2f %14.3f %11s %10s\n", "(all cores at once)", Cores(),
              r.limit_all_threads / 1e6, r.all_threads_cpu_us_per_token, "-", "-");
  for (const TextContender& c : r.contenders) {
    std::printf(
        "  %-18s %8s %12.2f %14.3f %10.1f%% %10.0f%s\n", c.name.c_str(),
        (c.name.rfind("feedline", 0) == 0 ? absl::StrCat("auto:", c.workers)
                                          : absl::StrCat(c.workers))
            .c_str(),
        c.tokens_per_s / 1e6, c.cpu_us_per_token, 100 * c.efficiency,
        double(c.peak_bytes) / (1 << 20),
        c.name == r.best_torch.name && c.workers == r.best_torch.workers ? "  (best torch)" : "");
  }
  auto cache = [](const TextContender& c) {
    if (c.words == 0) return std::string("; no word cache");
    return absl::StrFormat(
        "; word cache: %.1f%% of %d words found (first epoch, the cache cold: %.1f%%, %.2f M "
        "tokens/s)",
        100.0 * double(c.cached_words) / double(c.words), c.words,
        100.0 * double(c.first_epoch_cached_words) /
            double(std::max<int64_t>(c.first_epoch_words, 1)),
        c.first_epoch_tokens_per_s / 1e6);
  };
  std::printf("  feedline padded: %.2fx the best torch DataLoader, %.2fx the tokenizer limit%s\n",
              r.padded_vs_torch, r.padded_vs_limit, cache(padded).c_str());
  for (size_t i = 1; i < r.contenders.size() && r.contenders[i].limit > 0; ++i) {
    std::printf("  %s: %.2fx the tokenizer limit, packing efficiency %.1f%% (padded: %.1f%%)%s\n",
                r.contenders[i].name.c_str(), r.contenders[i].ratio_to_limit(),
                100 * r.contenders[i].efficiency, 100 * padded.efficiency,
                cache(r.contenders[i]).c_str());
  }
  std::printf(
      "  (the limit is SentencePiece's own encode; feedline's tokenizer looks words up in a cache "
      "first, with the same ids)\n");
  return r;
}

void WriteTextJson(const TextCompareResult& r, JsonWriter& json) {
  json.Key("documents").Integer(r.documents);
  json.Key("tokens").Integer(r.tokens);
  json.Key("tokenizer_limit_one_thread_tokens_per_s").Number(r.limit_one_thread);
  json.Key("tokenizer_limit_tokens_per_s").Number(r.limit);
  json.Key("tokenizer_all_threads_tokens_per_s").Number(r.limit_all_threads);
  json.Key("tokenizer_all_threads_cpu_us_per_token").Number(r.all_threads_cpu_us_per_token);
  json.Key("contenders").BeginArray();
  for (const TextContender& c : r.contenders) {
    json.BeginObject(true);
    json.Key("name").String(c.name);
    json.Key("workers").Integer(c.workers);
    json.Key("tokens_per_s").Number(c.tokens_per_s);
    json.Key("cpu_us_per_token").Number(c.cpu_us_per_token);
    json.Key("efficiency").Number(c.efficiency);
    json.Key("peak_bytes").Integer(c.peak_bytes);
    if (c.limit > 0) {
      json.Key("limit_tokens_per_s").Number(c.limit);
      json.Key("ratio_to_limit").Number(c.ratio_to_limit());
      json.Key("words").Integer(c.words);
      json.Key("cached_words").Integer(c.cached_words);
      json.Key("first_epoch_tokens_per_s").Number(c.first_epoch_tokens_per_s);
      json.Key("first_epoch_words").Integer(c.first_epoch_words);
      json.Key("first_epoch_cached_words").Integer(c.first_epoch_cached_words);
    }
    json.EndObject();
  }
  json.EndArray();
  json.Key("padded_vs_best_torch").Number(r.padded_vs_torch);
  json.Key("padded_vs_limit").Number(r.padded_vs_limit);
}

}  // namespace feedline::bench
