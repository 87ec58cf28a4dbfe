// The text built-in's one-call loaders (include/feedline/text.h: MakeTextLoader,
// MakePackedTextLoader): documents from files, URLs or shards (io's built-ins), tokenized by
// the text built-in's transform, on the generic engine.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "feedline/files.h"
#include "feedline/loader.h"
#include "feedline/text.h"

namespace feedline::text {

absl::StatusOr<std::shared_ptr<const Dataset>> OpenTextDocuments(const std::string& source,
                                                                 const std::string& field,
                                                                 double read_timeout_ms) {
  // WebDataset shards (a .tar or a brace pattern): one document per key.
  if (LooksLikeShards(source)) {
    absl::StatusOr<std::shared_ptr<FileDataset>> w =
        OpenWebDataset(source, {}, ReadLimits{read_timeout_ms});
    if (!w.ok()) return w.status();
    return std::shared_ptr<const Dataset>(*std::move(w));
  }
  absl::StatusOr<std::string> local = LocalCopy(source, read_timeout_ms);
  if (!local.ok()) return local.status();
  return OpenTextLines({*local, field, source});
}

absl::StatusOr<std::unique_ptr<Loader>> MakeTextLoader(std::shared_ptr<const Dataset> documents,
                                                       TokenizeOptions tokenize,
                                                       LoaderOptions options) {
  absl::StatusOr<std::shared_ptr<SampleTransform>> transform = MakeTokenizeTransform(tokenize);
  if (!transform.ok()) return transform.status();
  return Loader::Create(std::move(documents), *std::move(transform), std::move(options));
}

absl::StatusOr<std::unique_ptr<Loader>> MakeTextLoader(const std::string& source,
                                                       TokenizeOptions tokenize,
                                                       LoaderOptions options) {
  absl::StatusOr<std::shared_ptr<const Dataset>> docs =
      OpenTextDocuments(source, tokenize.field, options.read_timeout_ms());
  if (!docs.ok()) return docs.status();
  return MakeTextLoader(*std::move(docs), std::move(tokenize), std::move(options));
}

absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTextLoader(
    std::shared_ptr<const Dataset> documents, TokenizeOptions tokenize, PackOptions pack,
    LoaderOptions options) {
  if (tokenize.tokenizer == nullptr) return InvalidOption("tokenizer", "must be given");
  tokenize.ragged = true;
  if (tokenize.cut == nullptr) tokenize.cut = std::make_shared<CutCounter>();
  pack.cut = tokenize.cut;
  pack.pad_id = std::max(tokenize.tokenizer->pad_id(), 0);
  // Each document on one rank only (feedline/text.h: ranks agree on the steps instead).
  if (pack.mode != PackMode::kBucket) options.even_shards(false);
  absl::StatusOr<std::unique_ptr<Loader>> docs =
      MakeTextLoader(std::move(documents), std::move(tokenize), std::move(options));
  if (!docs.ok()) return docs.status();
  return PackedLoader::Create(*std::move(docs), std::move(pack));
}

absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTextLoader(const std::string& source,
                                                                   TokenizeOptions tokenize,
                                                                   PackOptions pack,
                                                                   LoaderOptions options) {
  absl::StatusOr<std::shared_ptr<const Dataset>> docs =
      OpenTextDocuments(source, tokenize.field, options.read_timeout_ms());
  if (!docs.ok()) return docs.status();
  return MakePackedTextLoader(*std::move(docs), std::move(tokenize), std::move(pack),
                              std::move(options));
}

namespace {

// A token file (and its index) by path or URL: the local copy to open, messages naming what
// the user gave.
absl::Status Localize(TokenFileOptions* f, double read_timeout_ms) {
  absl::StatusOr<std::string> local = LocalCopy(f->path, read_timeout_ms);
  if (!local.ok()) return local.status();
  if (f->name.empty()) f->name = f->path;
  f->path = *std::move(local);
  return absl::OkStatus();
}
absl::Status Localize(TokenDocumentOptions* f, double read_timeout_ms) {
  absl::StatusOr<std::vector<std::string>> local =
      LocalCopies({f->path, f->index_path}, read_timeout_ms);
  if (!local.ok()) return local.status();
  if (f->name.empty()) f->name = f->path;
  if (f->index_name.empty()) f->index_name = f->index_path;
  f->path = (*local)[0];
  f->index_path = (*local)[1];
  return absl::OkStatus();
}

// Packed rows of token documents (one file's or a mixture's), their cuts counted in `cut`.
absl::StatusOr<std::unique_ptr<PackedLoader>> PackTokenDocuments(
    std::shared_ptr<const Dataset> documents, std::shared_ptr<const SampleTransform> transform,
    std::shared_ptr<CutCounter> cut, PackOptions pack, LoaderOptions options) {
  pack.cut = std::move(cut);
  // Each document on one rank only (feedline/text.h: ranks agree on the steps instead).
  if (pack.mode != PackMode::kBucket) options.even_shards(false);
  absl::StatusOr<std::unique_ptr<Loader>> loader =
      Loader::Create(std::move(documents), std::move(transform), std::move(options));
  if (!loader.ok()) return loader.status();
  return PackedLoader::Create(*std::move(loader), std::move(pack));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Loader>> MakeTokenLoader(TokenFileOptions tokens,
                                                        LoaderOptions options) {
  if (absl::Status s = Localize(&tokens, options.read_timeout_ms()); !s.ok()) return s;
  absl::StatusOr<TokenWindows> windows = OpenTokenWindows(tokens);
  if (!windows.ok()) return windows.status();
  return Loader::Create(windows->dataset, windows->transform, std::move(options));
}

absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTokenLoader(TokenDocumentOptions docs,
                                                                    PackOptions pack,
                                                                    LoaderOptions options) {
  if (absl::Status s = Localize(&docs, options.read_timeout_ms()); !s.ok()) return s;
  if (docs.cut == nullptr) docs.cut = std::make_shared<CutCounter>();
  absl::StatusOr<TokenDocuments> opened = OpenTokenDocuments(docs);
  if (!opened.ok()) return opened.status();
  return PackTokenDocuments(opened->dataset, opened->transform, docs.cut, std::move(pack),
                            std::move(options));
}

absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTokenLoader(const TokenMix& documents,
                                                                    PackOptions pack,
                                                                    LoaderOptions options) {
  return PackTokenDocuments(documents.mix, documents.transform, documents.cut, std::move(pack),
                            std::move(options));
}

namespace {

absl::Status CheckWeights(size_t files, const std::vector<double>& weights) {
  if (files == 0) return InvalidOption("source", "a mixture needs at least one file");
  if (weights.size() != files) {
    return InvalidOption("weights", absl::StrCat(weights.size(), " weights for ", files, " files"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TokenMix> Mixed(std::vector<MixSource> sources,
                               std::vector<std::shared_ptr<const SampleTransform>> transforms,
                               const MixOptions& options) {
  absl::StatusOr<std::shared_ptr<Mix>> mix = Mix::Create(std::move(sources), options);
  if (!mix.ok()) return mix.status();
  absl::StatusOr<std::shared_ptr<SampleTransform>> t =
      PerSourceTransform(*mix, std::move(transforms));
  if (!t.ok()) return t.status();
  return TokenMix{*std::move(mix), *std::move(t), nullptr};
}

}  // namespace

absl::StatusOr<TokenMix> MixTokenWindows(std::vector<TokenFileOptions> files,
                                         const std::vector<double>& weights,
                                         const MixOptions& options, double read_timeout_ms) {
  if (absl::Status s = CheckWeights(files.size(), weights); !s.ok()) return s;
  std::vector<MixSource> sources;
  std::vector<std::shared_ptr<const SampleTransform>> transforms;
  for (size_t k = 0; k < files.size(); ++k) {
    TokenFileOptions& f = files[k];
    if (absl::Status s = Localize(&f, read_timeout_ms); !s.ok()) return s;
    absl::StatusOr<TokenWindows> w = OpenTokenWindows(f);
    if (!w.ok()) return w.status();
    sources.push_back({w->dataset, weights[k]});
    transforms.push_back(w->transform);
  }
  return Mixed(std::move(sources), std::move(transforms), options);
}

absl::StatusOr<TokenMix> MixTokenDocuments(std::vector<TokenDocumentOptions> files,
                                           const std::vector<double>& weights,
                                           const MixOptions& options, double read_timeout_ms) {
  if (absl::Status s = CheckWeights(files.size(), weights); !s.ok()) return s;
  std::shared_ptr<CutCounter> cut =
      files[0].cut != nullptr ? files[0].cut : std::make_shared<CutCounter>();
  std::vector<MixSource> sources;
  std::vector<std::shared_ptr<const SampleTransform>> transforms;
  for (size_t k = 0; k < files.size(); ++k) {
    TokenDocumentOptions& f = files[k];
    if (absl::Status s = Localize(&f, read_timeout_ms); !s.ok()) return s;
    f.cut = cut;
    absl::StatusOr<TokenDocuments> d = OpenTokenDocuments(f);
    if (!d.ok()) return d.status();
    sources.push_back({d->dataset, weights[k]});
    transforms.push_back(d->transform);
  }
  absl::StatusOr<TokenMix> m = Mixed(std::move(sources), std::move(transforms), options);
  if (m.ok()) m->cut = cut;
  return m;
}

absl::StatusOr<std::shared_ptr<const Tokenizer>> LoadSentencePieceFrom(
    const std::string& model, const SentencePieceOptions& options, double read_timeout_ms) {
  absl::StatusOr<std::string> local = LocalCopy(model, read_timeout_ms);
  if (!local.ok()) return local.status();
  absl::StatusOr<std::shared_ptr<const Tokenizer>> tokenizer = LoadSentencePiece(*local, options);
  if (!tokenizer.ok() && *local != model) {
    return absl::Status(tokenizer.status().code(),
                        absl::StrReplaceAll(tokenizer.status().message(), {{*local, model}}));
  }
  return tokenizer;
}

}  // namespace feedline::text
