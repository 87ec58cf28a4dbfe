// The text built-in's face (feedline.TextLoader, feedline.TokenLoader): SentencePiece
// tokenizers, token windows, tokenized documents and packed rows. Bindings only: the loaders
// are the text built-in's one-call factories (include/feedline/text.h).
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bind_common.h"
#include "feedline/mix.h"
#include "feedline/text.h"
#include "py_options.h"

namespace feedline::python {
namespace {

using PackedEpochHolder = std::unique_ptr<text::PackedEpoch, ReleaseGilDeleter>;

// documents=: a mixture (text_mix) read instead of the path.
std::shared_ptr<const Dataset> PopDocuments(py::kwargs& kwargs) {
  if (!kwargs.contains("documents")) return nullptr;
  return kwargs.attr("pop")("documents").cast<std::shared_ptr<Mix>>();
}

// A loaded tokenizer, shared by the loaders made with it (Python's view of it: its counters).
struct TokenizerHandle {
  std::shared_ptr<const text::Tokenizer> tokenizer;
};

text::PackOptions PackOptionsOf(const py::str& pack, int64_t seq_len, int64_t window_rows,
                                bool split_long, bool mask_boundaries, int64_t batch_size,
                                bool drop_last) {
  text::PackOptions p;
  p.mode = EnumFromPython<text::PackMode>("pack", pack);
  p.seq_len = seq_len;
  p.batch_size = batch_size;
  p.window_rows = window_rows;
  p.split_long = split_long;
  p.mask_boundaries = mask_boundaries;
  p.drop_last = drop_last;
  return p;
}

text::TokenizeOptions TokenizeOptionsOf(const std::string& field,
                                        std::shared_ptr<const text::Tokenizer> tokenizer,
                                        int64_t max_length, bool add_bos, bool add_eos,
                                        std::shared_ptr<text::CutCounter> cut) {
  text::TokenizeOptions t;
  t.tokenizer = std::move(tokenizer);
  t.max_length = max_length;
  t.add_bos = add_bos;
  t.add_eos = add_eos;
  t.field = field;
  t.cut = std::move(cut);
  return t;
}

py::dict PackedStateToDict(const text::PackedLoader::State& s) {
  py::dict d;
  d["documents"] = StateToDict(s.documents);
  d["batches_done"] = s.batches_done;
  d["document"] = s.document;
  d["offset"] = s.offset;
  d["seq_len"] = s.seq_len;
  d["batch_size"] = s.batch_size;
  d["window_rows"] = s.window_rows;
  d["mode"] = EnumName(text::PackMode(s.mode));
  d["version"] = 1;
  if (s.holes_world > 0) {  // a resplit epoch: the saved layout's cursors, rank by rank
    py::list documents, offsets;
    for (const text::PackedLoader::Cursor& c : s.holes) {
      documents.append(c.document);
      offsets.append(c.offset);
    }
    d["resplit_from"] =
        py::dict(py::arg("world_size") = s.holes_world, py::arg("skipped") = s.holes_base,
                 py::arg("documents") = documents, py::arg("offsets") = offsets);
  }
  return d;
}

text::PackedLoader::State DictToPackedState(const py::dict& d) {
  for (const char* k : {"documents", "batches_done", "document", "offset", "seq_len",
                        "batch_size", "window_rows", "mode"}) {
    if (!d.contains(k)) throw py::value_error(absl::StrCat("state_dict: missing key '", k, "'"));
  }
  text::PackedLoader::State s;
  if (!py::isinstance<py::dict>(d["documents"])) {
    throw py::type_error("state_dict: 'documents' must be a dict");
  }
  s.documents = DictToState(d["documents"].cast<py::dict>());
  for (auto [key, out] : {std::pair{"batches_done", &s.batches_done}, {"document", &s.document},
                          {"offset", &s.offset}, {"seq_len", &s.seq_len},
                          {"batch_size", &s.batch_size}, {"window_rows", &s.window_rows}}) {
    StateValue(d, key, out);
  }
  s.mode = int(EnumFromPython<text::PackMode>("state_dict: 'mode'", d["mode"]));
  if (d.contains("resplit_from")) {
    if (!py::isinstance<py::dict>(d["resplit_from"])) {
      throw py::type_error("state_dict: 'resplit_from' must be a dict");
    }
    const py::dict h = d["resplit_from"].cast<py::dict>();
    for (const char* k : {"world_size", "skipped", "documents", "offsets"}) {
      if (!h.contains(k)) {
        throw py::value_error(absl::StrCat("state_dict: resplit_from: missing key '", k, "'"));
      }
    }
    StateValue(h, "world_size", &s.holes_world);
    StateValue(h, "skipped", &s.holes_base);
    if (s.holes_world < 1 || s.holes_world > (int64_t{1} << 20)) {
      throw py::value_error("state_dict: resplit_from: world_size must be in [1, 2^20]");
    }
    for (const char* k : {"documents", "offsets"}) {
      if (!py::isinstance<py::list>(h[k]) || py::len(h[k]) != size_t(s.holes_world)) {
        throw py::value_error(
            absl::StrCat("state_dict: resplit_from: '", k, "' must be a list of world_size ints"));
      }
    }
    const py::list documents = h["documents"], offsets = h["offsets"];
    s.holes.resize(size_t(s.holes_world));
    for (size_t r = 0; r < s.holes.size(); ++r) {
      for (auto [item, out] :
           {std::pair{documents[r], &s.holes[r].document}, {offsets[r], &s.holes[r].offset}}) {
        if (!py::isinstance<py::int_>(item) || py::isinstance<py::bool_>(item)) {
          throw py::type_error("state_dict: resplit_from: cursors must be ints");
        }
        *out = item.cast<int64_t>();
      }
    }
  }
  return s;
}

}  // namespace

void BindText(py::module_& m) {
  // A weighted mixture of text sources (feedline.Mix as a TextLoader's source): each source's
  // documents as TextLoader reads them.
  m.def(
      "text_mix",
      [](const std::vector<std::string>& sources, const std::vector<double>& weights,
         const std::string& field, uint64_t seed, const std::string& end, int64_t samples_per_epoch,
         bool shuffle, double read_timeout_ms) {
        const MixOptions o = MixOptionsOf(seed, end, samples_per_epoch, shuffle);
        return Unlocked([&]() -> absl::StatusOr<std::shared_ptr<Mix>> {
          std::vector<MixSource> mix;
          for (size_t s = 0; s < sources.size(); ++s) {
            absl::StatusOr<std::shared_ptr<const Dataset>> docs =
                text::OpenTextDocuments(sources[s], field, read_timeout_ms);
            if (!docs.ok()) return docs.status();
            mix.push_back({*std::move(docs), weights.at(s)});
          }
          return Mix::Create(std::move(mix), o);
        });
      },
      py::arg("sources"), py::arg("weights"), py::arg("field"), py::arg("seed"), py::arg("end"),
      py::arg("samples_per_epoch"), py::arg("shuffle"),
      py::arg("read_timeout_ms") = LoaderOptions().read_timeout_ms());

  // A SentencePiece model (a path or URL), loaded once for a TextLoader's loaders.
  py::class_<TokenizerHandle>(m, "Tokenizer").def("counters", [](const TokenizerHandle& h) {
    const text::Tokenizer::Counters c = h.tokenizer->counters();
    py::dict d;
    d["word_cache"] = c.word_cache;
    d["documents"] = c.documents;
    d["words"] = c.words;
    d["cached_words"] = c.cached_words;
    return d;
  });
  m.def(
      "sentencepiece",
      [](const std::string& model, bool word_cache) {
        text::SentencePieceOptions options;
        options.word_cache = word_cache;
        return TokenizerHandle{Unlocked([&] { return text::LoadSentencePieceFrom(model, options); })};
      },
      py::arg("model"), py::arg("word_cache"));

  py::class_<text::CutCounter, std::shared_ptr<text::CutCounter>>(m, "CutCounter")
      .def_property_readonly("documents",
                             [](const text::CutCounter& c) { return c.documents.load(); })
      .def_property_readonly("tokens", [](const text::CutCounter& c) { return c.tokens.load(); })
      .def_property_readonly("partly", [](const text::CutCounter& c) { return c.partly.load(); });

  // Token windows of a token file (a path or URL).
  m.def(
      "token_loader",
      [](const std::string& path, const py::str& dtype, int64_t seq_len, int64_t vocab_size,
         const py::kwargs& engine) {
        text::TokenFileOptions t;
        t.path = path;
        t.dtype = EnumFromPython<text::TokenDType>("dtype", dtype);
        t.seq_len = seq_len;
        t.vocab_size = vocab_size;
        LoaderOptions o = EngineOptions(engine);
        return LoaderHolder(
            Unlocked([&] { return text::MakeTokenLoader(std::move(t), std::move(o)); }).release());
      },
      py::arg("path"), py::arg("dtype"), py::arg("seq_len"), py::arg("vocab_size"));

  // Documents from a text / JSON Lines file or WebDataset shards, tokenized in the workers:
  // (loader, cut counter). Documents cut to max_length: truncation is what padded batches ask
  // for, but the tokens past it are counted (stats()["truncation"]) and warned about, never
  // dropped unseen.
  m.def(
      "text_loader",
      [](const std::string& path, const std::string& field, const TokenizerHandle& tokenizer,
         int64_t max_length, bool add_bos, bool add_eos, py::kwargs engine) {
        std::shared_ptr<const Dataset> docs = PopDocuments(engine);
        LoaderOptions o = EngineOptions(engine);
        auto cut = std::make_shared<text::CutCounter>();
        text::TokenizeOptions t =
            TokenizeOptionsOf(field, tokenizer.tokenizer, max_length, add_bos, add_eos, cut);
        std::unique_ptr<Loader> loader = Unlocked([&] {
          return docs != nullptr ? text::MakeTextLoader(docs, std::move(t), std::move(o))
                                 : text::MakeTextLoader(path, std::move(t), std::move(o));
        });
        return py::make_tuple(LoaderHolder(loader.release()), cut);
      },
      py::arg("path"), py::arg("field"), py::arg("tokenizer"), py::arg("max_length"),
      py::arg("add_bos"), py::arg("add_eos"));

  // Packed rows of tokenized documents: `batch_size` rows per batch (and drop_last) are the
  // packer's; the documents are tokenized `doc_batch` at a time in the workers, every one.
  m.def(
      "packed_text_loader",
      [](const std::string& path, const std::string& field, const TokenizerHandle& tokenizer,
         int64_t max_length, bool add_bos, bool add_eos, const py::str& pack, int64_t seq_len,
         int64_t window_rows, bool split_long, bool mask_boundaries, int64_t doc_batch,
         int64_t batch_size, bool drop_last, py::kwargs engine) {
        std::shared_ptr<const Dataset> docs = PopDocuments(engine);
        text::PackOptions p = PackOptionsOf(pack, seq_len, window_rows, split_long,
                                            mask_boundaries, batch_size, drop_last);
        LoaderOptions o = EngineOptions(engine).batch_size(doc_batch).drop_last(false);
        text::TokenizeOptions t =
            TokenizeOptionsOf(field, tokenizer.tokenizer, max_length, add_bos, add_eos, nullptr);
        return Unlocked([&] {
          return docs != nullptr
                     ? text::MakePackedTextLoader(docs, std::move(t), std::move(p), std::move(o))
                     : text::MakePackedTextLoader(path, std::move(t), std::move(p), std::move(o));
        });
      },
      py::arg("path"), py::arg("field"), py::arg("tokenizer"), py::arg("max_length"),
      py::arg("add_bos"), py::arg("add_eos"), py::arg("pack"), py::arg("seq_len"),
      py::arg("window_rows"), py::arg("split_long"), py::arg("mask_boundaries"),
      py::arg("doc_batch"), py::arg("batch_size"), py::arg("drop_last"));

  // Packed rows of a token file's documents (its document index): as packed_text_loader.
  m.def(
      "packed_token_loader",
      [](const std::string& path, const py::str& dtype, const std::string& index,
         int64_t vocab_size, int64_t max_length, int64_t eos_id, const py::str& pack,
         int64_t seq_len, int64_t window_rows, bool split_long, bool mask_boundaries,
         int64_t doc_batch, int64_t batch_size, bool drop_last, int64_t pad_id,
         const py::kwargs& engine) {
        text::TokenDocumentOptions t;
        t.path = path;
        t.dtype = EnumFromPython<text::TokenDType>("dtype", dtype);
        t.index_path = index;
        t.vocab_size = vocab_size;
        t.max_length = max_length;
        t.eos_id = eos_id;
        text::PackOptions p = PackOptionsOf(pack, seq_len, window_rows, split_long,
                                            mask_boundaries, batch_size, drop_last);
        p.pad_id = pad_id;
        LoaderOptions o = EngineOptions(engine).batch_size(doc_batch).drop_last(false);
        return Unlocked([&] {
          return text::MakePackedTokenLoader(std::move(t), std::move(p), std::move(o));
        });
      },
      py::arg("path"), py::arg("dtype"), py::arg("index"), py::arg("vocab_size"),
      py::arg("max_length"), py::arg("eos_id"), py::arg("pack"), py::arg("seq_len"),
      py::arg("window_rows"), py::arg("split_long"), py::arg("mask_boundaries"),
      py::arg("doc_batch"), py::arg("batch_size"), py::arg("drop_last"), py::arg("pad_id"));

  // Mixtures of token files (feedline.Mix as a TokenLoader's source): (loader, the Mix, for
  // stats()["mix"]). Windows, or packed documents (every file with its index).
  m.def(
      "token_mix_loader",
      [](const std::vector<std::string>& paths, const std::vector<double>& weights,
         const std::string& end, int64_t samples_per_epoch, const py::str& dtype, int64_t seq_len,
         int64_t vocab_size, const py::kwargs& engine) {
        LoaderOptions o = EngineOptions(engine);
        const MixOptions mo = MixOptionsOf(o.seed(), end, samples_per_epoch, o.shuffle());
        std::vector<text::TokenFileOptions> files;
        for (const std::string& path : paths) {
          text::TokenFileOptions t;
          t.path = path;
          t.dtype = EnumFromPython<text::TokenDType>("dtype", dtype);
          t.seq_len = seq_len;
          t.vocab_size = vocab_size;
          files.push_back(std::move(t));
        }
        std::shared_ptr<Mix> mix;
        std::unique_ptr<Loader> loader = Unlocked([&]() -> absl::StatusOr<std::unique_ptr<Loader>> {
          absl::StatusOr<text::TokenMix> tm =
              text::MixTokenWindows(std::move(files), weights, mo, o.read_timeout_ms());
          if (!tm.ok()) return tm.status();
          mix = tm->mix;
          return Loader::Create(tm->mix, tm->transform, std::move(o));
        });
        return py::make_tuple(LoaderHolder(loader.release()), mix);
      },
      py::arg("paths"), py::arg("weights"), py::arg("end"), py::arg("samples_per_epoch"),
      py::arg("dtype"), py::arg("seq_len"), py::arg("vocab_size"));
  m.def(
      "packed_token_mix_loader",
      [](const std::vector<std::string>& paths, const std::vector<std::string>& indexes,
         const std::vector<double>& weights, const std::string& end, int64_t samples_per_epoch,
         const py::str& dtype, int64_t vocab_size, int64_t max_length, int64_t eos_id,
         const py::str& pack, int64_t seq_len, int64_t window_rows, bool split_long,
         bool mask_boundaries, int64_t doc_batch, int64_t batch_size, bool drop_last,
         int64_t pad_id, const py::kwargs& engine) {
        if (indexes.size() != paths.size()) throw py::value_error("index: one per source");
        text::PackOptions p = PackOptionsOf(pack, seq_len, window_rows, split_long, mask_boundaries,
                                            batch_size, drop_last);
        p.pad_id = pad_id;
        LoaderOptions o = EngineOptions(engine).batch_size(doc_batch).drop_last(false);
        const MixOptions mo = MixOptionsOf(o.seed(), end, samples_per_epoch, o.shuffle());
        std::vector<text::TokenDocumentOptions> files;
        for (size_t k = 0; k < paths.size(); ++k) {
          text::TokenDocumentOptions t;
          t.path = paths[k];
          t.index_path = indexes[k];
          t.dtype = EnumFromPython<text::TokenDType>("dtype", dtype);
          t.vocab_size = vocab_size;
          t.max_length = max_length;
          t.eos_id = eos_id;
          files.push_back(std::move(t));
        }
        std::shared_ptr<Mix> mix;
        std::unique_ptr<text::PackedLoader> loader =
            Unlocked([&]() -> absl::StatusOr<std::unique_ptr<text::PackedLoader>> {
              absl::StatusOr<text::TokenMix> tm =
                  text::MixTokenDocuments(std::move(files), weights, mo, o.read_timeout_ms());
              if (!tm.ok()) return tm.status();
              mix = tm->mix;
              return text::MakePackedTokenLoader(*tm, std::move(p), std::move(o));
            });
        return py::make_tuple(py::cast(std::move(loader)), mix);
      },
      py::arg("paths"), py::arg("indexes"), py::arg("weights"), py::arg("end"),
      py::arg("samples_per_epoch"), py::arg("dtype"), py::arg("vocab_size"), py::arg("max_length"),
      py::arg("eos_id"), py::arg("pack"), py::arg("seq_len"), py::arg("window_rows"),
      py::arg("split_long"), py::arg("mask_boundaries"), py::arg("doc_batch"),
      py::arg("batch_size"), py::arg("drop_last"), py::arg("pad_id"));

  py::class_<text::PackedEpoch, PackedEpochHolder>(m, "PackedEpoch")
      .def_property_readonly("epoch", &text::PackedEpoch::epoch)
      .def("__len__",
           [](const text::PackedEpoch&) -> int64_t {
             throw py::type_error("packed rows per epoch are known only once it is tokenized");
           })
      .def("cancel",
           [](text::PackedEpoch& e) {
             py::gil_scoped_release release;
             e.Cancel();
           })
      .def("next_fields", [](text::PackedEpoch& e) { return NextFields(e); })
      .def("padding_fields", [](text::PackedEpoch& e) {
        absl::StatusOr<Batch> b = e.PaddingBatch();
        if (!b.ok()) ThrowStatus(b.status(), false);
        return FieldsTuple(*b);
      });

  py::class_<text::PackedLoader>(m, "PackedLoader")
      .def("start_epoch",
           [](text::PackedLoader& l) {
             std::unique_ptr<text::PackedEpoch> e;
             {
               py::gil_scoped_release release;
               e = l.StartEpoch();
             }
             return PackedEpochHolder(e.release());
           })
      .def_property_readonly(
          "num_samples", [](const text::PackedLoader& l) { return l.documents().num_samples(); })
      .def_property_readonly(
          "on_error",
          [](const text::PackedLoader& l) { return EnumName(l.documents().options().on_error()); })
      .def("set_epoch", &text::PackedLoader::set_epoch)
      .def_property_readonly("next_epoch", &text::PackedLoader::next_epoch)
      .def("state", [](const text::PackedLoader& l) { return PackedStateToDict(l.state()); })
      .def("load_state",
           [](text::PackedLoader& l, const py::object& d, bool resplit) {
             // resplit: the states of every rank of the saved layout (a list), or one state
             // when that layout had one rank.
             absl::Status st;
             if (resplit) {
               std::vector<text::PackedLoader::State> states;
               if (py::isinstance<py::dict>(d)) {
                 states.push_back(DictToPackedState(d.cast<py::dict>()));
               } else {
                 for (const py::handle h : d) {
                   if (!py::isinstance<py::dict>(h)) {
                     throw py::type_error("state_dict: each rank's state must be a dict");
                   }
                   states.push_back(DictToPackedState(h.cast<py::dict>()));
                 }
               }
               st = l.Resplit(states);
             } else {
               if (!py::isinstance<py::dict>(d)) {
                 throw py::type_error(
                     "state_dict: a dict (a list of every rank's states only with resplit=True)");
               }
               st = l.LoadState(DictToPackedState(d.cast<py::dict>()));
             }
             if (!st.ok()) ThrowStatus(st, false);
           })
      .def("save_trace",
           [](const text::PackedLoader& l, const std::string& path) {
             absl::Status s;
             {
               py::gil_scoped_release release;
               s = l.documents().SaveTrace(path);
             }
             if (!s.ok()) ThrowStatus(s, false);
           })
      .def("stats",
           [](const text::PackedLoader& l) {
             py::dict d = StatsToDict(l.documents().stats());
             const text::PackStats p = l.pack_stats();
             py::dict packing;
             packing["rows"] = p.rows;
             packing["tokens"] = p.tokens;
             packing["slots"] = p.slots;
             packing["documents"] = p.documents;
             packing["truncated"] = p.truncated;
             packing["split"] = p.split;
             packing["empty"] = p.empty;
             packing["padding_rows"] = p.padding_rows;
             packing["cut_documents"] = p.cut_documents;
             packing["cut_tokens"] = p.cut_tokens;
             packing["cut_partly"] = p.cut_partly;
             packing["efficiency"] = p.efficiency();
             d["packing"] = packing;
             return d;
           })
      .def("set_workers", [](text::PackedLoader& l, int n) { l.documents().set_workers(n); })
      .def("set_prefetch", [](text::PackedLoader& l, int n) { l.documents().set_prefetch(n); })
      .def_property_readonly(
          "workers", [](const text::PackedLoader& l) { return l.documents().stats().workers; })
      .def_property_readonly(
          "prefetch", [](const text::PackedLoader& l) { return l.documents().stats().prefetch; });
}

}  // namespace feedline::python
