// The text built-in's one-call loaders (include/feedline/text.h: MakeTextLoader,
// MakePackedTextLoader): documents from files, URLs or shards (io's built-ins), tokenized by
// the text built-in's transform, on the generic engine.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"
#include "feedline/text.h"

namespace feedline::text {

absl::StatusOr<std::unique_ptr<Loader>> MakeTextLoader(const std::string& source,
                                                       TokenizeOptions tokenize,
                                                       LoaderOptions options) {
  // WebDataset shards (a .tar or a brace pattern): one document per key.
  const bool shards = absl::EndsWith(source, ".tar") || absl::StrContains(source, "{");
  absl::StatusOr<std::shared_ptr<const Dataset>> docs;
  if (shards) {
    absl::StatusOr<std::shared_ptr<FileDataset>> w =
        OpenWebDataset(source, {}, options.read_timeout_ms());
    if (!w.ok()) return w.status();
    docs = std::shared_ptr<const Dataset>(*std::move(w));
  } else {
    absl::StatusOr<std::string> local = LocalCopy(source, options.read_timeout_ms());
    if (!local.ok()) return local.status();
    docs = OpenTextLines({*local, tokenize.field, source});
  }
  if (!docs.ok()) return docs.status();
  absl::StatusOr<std::shared_ptr<SampleTransform>> transform = MakeTokenizeTransform(tokenize);
  if (!transform.ok()) return transform.status();
  return Loader::Create(*std::move(docs), *std::move(transform), std::move(options));
}

absl::StatusOr<std::unique_ptr<PackedLoader>> MakePackedTextLoader(const std::string& source,
                                                                   TokenizeOptions tokenize,
                                                                   PackOptions pack,
                                                                   LoaderOptions options) {
  if (tokenize.tokenizer == nullptr) return InvalidOption("tokenizer", "must be given");
  tokenize.ragged = true;
  if (tokenize.cut == nullptr) tokenize.cut = std::make_shared<CutCounter>();
  pack.cut = tokenize.cut;
  pack.pad_id = std::max(tokenize.tokenizer->pad_id(), 0);
  absl::StatusOr<std::unique_ptr<Loader>> docs =
      MakeTextLoader(source, std::move(tokenize), std::move(options));
  if (!docs.ok()) return docs.status();
  return PackedLoader::Create(*std::move(docs), std::move(pack));
}

}  // namespace feedline::text
