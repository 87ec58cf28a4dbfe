// FNV-1a, 64-bit: the hash behind data sets' fingerprints (identity checks of saved loader
// states, not security).
//
// Thread safety: a value; one per computation.
#ifndef FEEDLINE_SRC_CORE_FNV_H_
#define FEEDLINE_SRC_CORE_FNV_H_

#include <cstddef>
#include <cstdint>

namespace feedline {

struct Fnv1a {
  uint64_t value = 1469598103934665603ULL;
  void Mix(const void* data, size_t n) {
    const auto* b = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < n; ++i) value = (value ^ b[i]) * 1099511628211ULL;
  }
};

}  // namespace feedline

#endif  // FEEDLINE_SRC_CORE_FNV_H_
