// UTF-8 validation, as the text sources require it of every document (and the tokenizer's
// fuzz target of its inputs).
#ifndef FEEDLINE_SRC_TEXT_UTF8_H_
#define FEEDLINE_SRC_TEXT_UTF8_H_

#include <cstddef>
#include <cstdint>

namespace feedline::text {

// Whether s[0, n) is valid UTF-8 (no overlong forms, surrogates or code points past
// U+10FFFF); if not, `bad_at` is the offset of the first bad sequence.
inline bool ValidUtf8(const uint8_t* s, size_t n, size_t* bad_at) {
  size_t i = 0;
  while (i < n) {
    const uint8_t c = s[i];
    int len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (len == 0 || i + size_t(len) > n) {
      *bad_at = i;
      return false;
    }
    uint32_t cp = len == 1 ? c : c & (0x7F >> len);
    for (int k = 1; k < len; ++k) {
      if ((s[i + size_t(k)] & 0xC0) != 0x80) {
        *bad_at = i;
        return false;
      }
      cp = (cp << 6) | (s[i + size_t(k)] & 0x3F);
    }
    // overlong forms, surrogates, beyond U+10FFFF
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      *bad_at = i;
      return false;
    }
    i += size_t(len);
  }
  return true;
}

}  // namespace feedline::text

#endif  // FEEDLINE_SRC_TEXT_UTF8_H_
