// The text API in a program that links LibTorch: documents from a text file, tokenized by a
// SentencePiece model in the workers, batches viewed as tensors. Checks every row against the
// tokenizer called here and prints "documents <N> tokens <T> ok".
#include <feedline/feedline.h>
#include <feedline/text.h>
#include <feedline/torch.h>
#include <torch/torch.h>

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TEXT_FILE SPM_MODEL\n", argv[0]);
    return 2;
  }
  // Before LibTorch's first use too: both libraries live side by side.
  const torch::Tensor probe = torch::ones({2});
  auto tokenizer = feedline::text::LoadSentencePiece(argv[2]);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  std::vector<std::string> docs;
  {
    std::ifstream in(argv[1]);
    for (std::string line; std::getline(in, line);) {
      if (!line.empty()) docs.push_back(line);
    }
  }
  auto lines = feedline::text::OpenTextLines({argv[1]});
  if (!lines.ok()) {
    std::fprintf(stderr, "%s\n", lines.status().ToString().c_str());
    return 1;
  }
  feedline::text::TokenizeOptions topt;
  topt.tokenizer = *tokenizer;
  topt.max_length = 4096;
  auto transform = feedline::text::MakeTokenizeTransform(topt);
  if (!transform.ok()) {
    std::fprintf(stderr, "%s\n", transform.status().ToString().c_str());
    return 1;
  }
  auto loader = feedline::Loader::Create(
      *lines, *transform, feedline::LoaderOptions().batch_size(3).workers(2));
  if (!loader.ok()) {
    std::fprintf(stderr, "%s\n", loader.status().ToString().c_str());
    return 1;
  }
  long long documents = 0, tokens = 0;
  for (absl::StatusOr<feedline::Batch>& batch : **loader) {
    if (!batch.ok()) {
      std::fprintf(stderr, "%s\n", batch.status().ToString().c_str());
      return 1;
    }
    const torch::Tensor ids = feedline::torch::to_tensor(*batch, 0);
    const feedline::TensorView view = batch->field(0);
    for (int64_t i = 0; i < batch->size(); ++i) {
      std::vector<int> want;
      const int64_t index = batch->indices()[i];
      if (!(*tokenizer)->Encode(docs.at(size_t(index)), &want).ok()) return 1;
      const torch::Tensor row = ids[i].slice(0, 0, view.lengths[i]);
      if (view.lengths[i] != int64_t(want.size()) ||
          !torch::equal(row, torch::tensor(std::vector<int64_t>(want.begin(), want.end())))) {
        std::fprintf(stderr, "document %lld: wrong ids\n", (long long)index);
        return 1;
      }
      tokens += view.lengths[i];
      ++documents;
    }
  }
  std::printf("documents %lld tokens %lld ok\n", documents, tokens + probe.size(0) * 0);
  return 0;
}
