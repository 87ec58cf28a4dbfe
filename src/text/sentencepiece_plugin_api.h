// The C face of libfeedline_sentencepiece.so, the one object that links SentencePiece.
//
// Why a plugin: Debian's libsentencepiece.so.0 bundles its own protobuf-lite (3.14) and exports
// every symbol of it, while LibTorch links the system's libprotobuf (3.21). When both are in a
// program's global symbol scope, whichever comes first in the link order wins the other's
// lookups, and the program dies before main (protobuf's start-up code running on the other
// version's functions). So nothing of feedline links libsentencepiece: src/text/
// sentencepiece_model.cc loads this plugin on first use with local symbol binding (RTLD_LOCAL,
// and RTLD_DEEPBIND so that SentencePiece's own references resolve to its own protobuf first),
// and talks to it through the table below. Only plain C types cross it, and no memory changes
// hands: what the plugin returns stays the plugin's (valid until the next call on the same
// thread, or for the model's lifetime where said), and the caller copies it.
#ifndef FEEDLINE_SRC_TEXT_SENTENCEPIECE_PLUGIN_API_H_
#define FEEDLINE_SRC_TEXT_SENTENCEPIECE_PLUGIN_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Bumped whenever the table changes; the loader refuses a plugin of another version.
#define FEEDLINE_SPM_ABI_VERSION 1

// Piece kinds (feedline_spm_api::piece_flags).
#define FEEDLINE_SPM_UNKNOWN 1
#define FEEDLINE_SPM_CONTROL 2
#define FEEDLINE_SPM_UNUSED 4
#define FEEDLINE_SPM_BYTE 8

struct feedline_spm_api {
  int abi_version;
  // A model loaded from `path`, or null with the reason in *error (the plugin's, valid until
  // the thread's next call).
  void* (*load)(const char* path, const char** error);
  void (*destroy)(void* model);
  // Encodes text[0, len). Returns the number of pieces, or -1 with *error set. *ids (and, when
  // begins/ends are not null, each piece's byte range in the text) point to the calling thread's
  // buffers in the plugin, valid until its next call.
  int64_t (*encode)(const void* model, const char* text, size_t len, const int** ids,
                    const uint32_t** begins, const uint32_t** ends, const char** error);
  // The scores of the best and second-best segmentations (second = -inf when there is one).
  int (*two_best_scores)(const void* model, const char* text, size_t len, float* best,
                         float* second, const char** error);
  int (*vocab_size)(const void* model);
  // The piece's bytes, valid for the model's lifetime.
  const char* (*id_to_piece)(const void* model, int id, size_t* len);
  int (*piece_flags)(const void* model, int id);
  float (*score)(const void* model, int id);
  int (*bos_id)(const void* model);
  int (*eos_id)(const void* model);
  int (*pad_id)(const void* model);
};

// The plugin's one exported symbol.
#define FEEDLINE_SPM_ENTRY "feedline_spm_api_v1"
typedef const struct feedline_spm_api* (*feedline_spm_entry_fn)(void);

#ifdef __cplusplus
}
#endif

#endif  // FEEDLINE_SRC_TEXT_SENTENCEPIECE_PLUGIN_API_H_
