// feedline-bench-text: the text workloads of `feedline-bench --compare-text` (text_bench.h),
// which runs this program. It is a separate executable because Debian's libsentencepiece
// exports a bundled protobuf (3.14) that clashes with LibTorch's libprotobuf (3.21) in one
// process' global symbol scope, and feedline-bench links LibTorch (--compare-dataset).
//
//   feedline-bench-text --data-dir DIR --python PATH --script-dir DIR [--epochs N]
//                       [--torch-workers 1,2,4] [--json FILE] [--quiet]
//   feedline-bench-text --data-dir DIR --prepare   (makes the corpus and model only: --e2e)
#include <cstdio>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench_util.h"
#include "text_bench.h"

int main(int argc, char** argv) {
  feedline::bench::TextCompareOptions o;
  std::string json_path;
  bool prepare = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quiet") {
      o.quiet = true;
      continue;
    }
    if (arg == "--prepare") {
      prepare = true;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "feedline-bench-text: %s needs a value\n", arg.c_str());
      return 2;
    }
    const std::string value = argv[++i];
    bool ok = true;
    if (arg == "--data-dir") {
      o.data_dir = value;
    } else if (arg == "--python") {
      o.python = value;
    } else if (arg == "--script-dir") {
      o.script_dir = value;
    } else if (arg == "--json") {
      json_path = value;
    } else if (arg == "--epochs") {
      ok = absl::SimpleAtoi(value, &o.epochs) && o.epochs >= 2;
    } else if (arg == "--torch-workers") {
      for (absl::string_view w : absl::StrSplit(value, ',', absl::SkipEmpty())) {
        int n = 0;
        ok = ok && absl::SimpleAtoi(w, &n) && n >= 1;
        o.torch_workers.push_back(n);
      }
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr, "feedline-bench-text: bad option %s %s\n", arg.c_str(), value.c_str());
      return 2;
    }
  }
  if (prepare && !o.data_dir.empty()) {
    if (absl::Status s = feedline::bench::EnsureCorpus(o.data_dir, o.quiet); !s.ok()) {
      std::fprintf(stderr, "feedline-bench: %s\n", s.ToString().c_str());
      return 1;
    }
    return 0;
  }
  if (o.data_dir.empty() || o.python.empty() || o.script_dir.empty()) {
    std::fprintf(stderr, "feedline-bench-text: --data-dir, --python and --script-dir are needed\n");
    return 2;
  }
  if (o.torch_workers.empty()) o.torch_workers = {1, 2};
  absl::StatusOr<feedline::bench::TextCompareResult> r = feedline::bench::RunTextComparison(o);
  if (!r.ok()) {
    std::fprintf(stderr, "feedline-bench: %s\n", r.status().ToString().c_str());
    return 1;
  }
  if (!json_path.empty()) {
    feedline::bench::JsonWriter json;
    json.BeginObject();
    json.Key("mode").String("compare_text");
    json.Key("epochs").Integer(o.epochs);
    json.Key("cores").Integer(feedline::bench::Cores());
    feedline::bench::WriteTextJson(*r, json);
    json.EndObject();
    if (absl::Status s = feedline::bench::WriteTextFile(json_path, json.Finish()); !s.ok()) {
      std::fprintf(stderr, "feedline-bench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  return 0;
}
