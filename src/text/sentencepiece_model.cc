#include "text/sentencepiece_model.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "text/sentencepiece_plugin_api.h"

namespace feedline::text {

namespace {

constexpr char kPluginName[] = "libfeedline_sentencepiece.so";

// RTLD_DEEPBIND makes SentencePiece's references resolve to its own bundled protobuf before the
// program's. The sanitizer runtimes refuse it (they must see every allocation), and sanitizer
// builds link no LibTorch, so there plain local binding is enough.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

// Where the plugin may be, most specific first: the variable a user sets, beside the object that
// holds this code (the Python extension's folder, a shared libfeedline's, a program's) and in its
// feedline/ subfolder, the program's own search path (RUNPATH: the installed CMake package adds
// its lib/feedline), then where this build installs it and where the build tree has it.
std::vector<std::string> Candidates() {
  std::vector<std::string> c;
  if (const char* env = std::getenv("FEEDLINE_SENTENCEPIECE_PLUGIN"); env != nullptr && *env) {
    c.emplace_back(env);
    return c;  // a user's explicit choice is the only one tried
  }
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&Candidates), &info) != 0 && info.dli_fname != nullptr &&
      info.dli_fname[0] != '\0') {
    const std::string dir = DirOf(info.dli_fname);
    c.push_back(dir + "/" + kPluginName);
    c.push_back(dir + "/feedline/" + kPluginName);
  }
  c.emplace_back(kPluginName);
#ifdef FEEDLINE_SPM_PLUGIN_INSTALL_DIR
  c.push_back(std::string(FEEDLINE_SPM_PLUGIN_INSTALL_DIR) + "/" + kPluginName);
#endif
#ifdef FEEDLINE_SPM_PLUGIN_BUILD_DIR
  c.push_back(std::string(FEEDLINE_SPM_PLUGIN_BUILD_DIR) + "/" + kPluginName);
#endif
  return c;
}

struct Plugin {
  const feedline_spm_api* api = nullptr;
  std::string error;  // why it could not be loaded
};

const Plugin& GetPlugin() {
  static const Plugin plugin = [] {
    Plugin p;
    int flags = RTLD_NOW | RTLD_LOCAL;
    if (!kSanitized) flags |= RTLD_DEEPBIND;
    std::string tried;
    for (const std::string& path : Candidates()) {
      void* h = dlopen(path.c_str(), flags);
      if (h == nullptr) {
        const char* e = dlerror();
        tried += "\n  " + path + ": " + (e != nullptr ? e : "not loadable");
        continue;
      }
      auto entry = reinterpret_cast<feedline_spm_entry_fn>(dlsym(h, FEEDLINE_SPM_ENTRY));
      const feedline_spm_api* api = entry != nullptr ? entry() : nullptr;
      if (api == nullptr || api->abi_version != FEEDLINE_SPM_ABI_VERSION) {
        tried += "\n  " + path + ": not feedline's SentencePiece plugin of this version";
        dlclose(h);
        continue;
      }
      p.api = api;  // the handle stays open for the life of the process
      return p;
    }
    p.error = std::string("feedline's SentencePiece plugin (") + kPluginName +
              ") could not be loaded; set FEEDLINE_SENTENCEPIECE_PLUGIN to its path. Tried:" +
              tried;
    return p;
  }();
  return plugin;
}

}  // namespace

struct SentencePieceModel::Impl {
  const feedline_spm_api* api = nullptr;
  void* model = nullptr;
  std::vector<std::string> pieces;
  std::vector<int> flags;
  std::vector<float> scores;
  int bos = -1, eos = -1, pad = -1;
  std::string empty;
  ~Impl() {
    if (model != nullptr) api->destroy(model);
  }
};

SentencePieceModel::SentencePieceModel() : impl_(std::make_unique<Impl>()) {}
SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  const Plugin& plugin = GetPlugin();
  if (plugin.api == nullptr) {
    *error = plugin.error;
    return nullptr;
  }
  std::unique_ptr<SentencePieceModel> m(new SentencePieceModel());
  Impl& im = *m->impl_;
  im.api = plugin.api;
  const char* e = nullptr;
  im.model = im.api->load(path.c_str(), &e);
  if (im.model == nullptr) {
    *error = e != nullptr ? e : "SentencePiece could not load the model";
    return nullptr;
  }
  // The vocabulary's per-piece facts are copied once: the hot paths (the word cache's checks,
  // IdToPiece's reference) then read feedline's own memory.
  const int n = im.api->vocab_size(im.model);
  im.pieces.resize(size_t(n));
  im.flags.resize(size_t(n));
  im.scores.resize(size_t(n));
  for (int id = 0; id < n; ++id) {
    size_t len = 0;
    const char* p = im.api->id_to_piece(im.model, id, &len);
    im.pieces[size_t(id)].assign(p, len);
    im.flags[size_t(id)] = im.api->piece_flags(im.model, id);
    im.scores[size_t(id)] = im.api->score(im.model, id);
  }
  im.bos = im.api->bos_id(im.model);
  im.eos = im.api->eos_id(im.model);
  im.pad = im.api->pad_id(im.model);
  return m;
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  return EncodeWithOffsets(text, ids, nullptr, nullptr, error);
}

bool SentencePieceModel::EncodeWithOffsets(std::string_view text, std::vector<int>* ids,
                                           std::vector<uint32_t>* begins,
                                           std::vector<uint32_t>* ends, std::string* error) const {
  const bool offsets = begins != nullptr || ends != nullptr;
  const int* pid = nullptr;
  const uint32_t* pb = nullptr;
  const uint32_t* pe = nullptr;
  const char* e = nullptr;
  const int64_t n = impl_->api->encode(impl_->model, text.data(), text.size(), &pid,
                                       offsets ? &pb : nullptr, offsets ? &pe : nullptr, &e);
  ids->clear();
  if (begins != nullptr) begins->clear();
  if (ends != nullptr) ends->clear();
  if (n < 0) {
    *error = e != nullptr ? e : "SentencePiece could not encode the text";
    return false;
  }
  ids->assign(pid, pid + n);
  if (begins != nullptr) begins->assign(pb, pb + n);
  if (ends != nullptr) ends->assign(pe, pe + n);
  return true;
}

bool SentencePieceModel::TwoBestScores(std::string_view text, float* best, float* second,
                                       std::string* error) const {
  const char* e = nullptr;
  if (impl_->api->two_best_scores(impl_->model, text.data(), text.size(), best, second, &e) != 0) {
    *error = e != nullptr ? e : "SentencePiece could not score the text";
    return false;
  }
  return true;
}

const std::string& SentencePieceModel::IdToPiece(int id) const {
  // SentencePiece answers an id out of range with an empty piece (after logging); so does this.
  if (id < 0 || size_t(id) >= impl_->pieces.size()) return impl_->empty;
  return impl_->pieces[size_t(id)];
}

namespace {
int FlagsOf(const std::vector<int>& flags, int id) {
  return id >= 0 && size_t(id) < flags.size() ? flags[size_t(id)] : 0;
}
}  // namespace

bool SentencePieceModel::IsUnknown(int id) const {
  return (FlagsOf(impl_->flags, id) & FEEDLINE_SPM_UNKNOWN) != 0;
}
bool SentencePieceModel::IsNormal(int id) const {
  if (id < 0 || size_t(id) >= impl_->flags.size()) return false;
  return (impl_->flags[size_t(id)] & (FEEDLINE_SPM_UNKNOWN | FEEDLINE_SPM_CONTROL |
                                      FEEDLINE_SPM_UNUSED | FEEDLINE_SPM_BYTE)) == 0;
}
float SentencePieceModel::Score(int id) const {
  return id >= 0 && size_t(id) < impl_->scores.size() ? impl_->scores[size_t(id)] : 0.0f;
}

int SentencePieceModel::vocab_size() const { return int(impl_->pieces.size()); }
int SentencePieceModel::bos_id() const { return impl_->bos; }
int SentencePieceModel::eos_id() const { return impl_->eos; }
int SentencePieceModel::pad_id() const { return impl_->pad; }

}  // namespace feedline::text
