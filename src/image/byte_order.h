// Unaligned little- and big-endian reads for the image format parsers (formats.cc, exif.cc,
// decoder.cc); the callers bound-check first.
#ifndef FEEDLINE_SRC_IMAGE_BYTE_ORDER_H_
#define FEEDLINE_SRC_IMAGE_BYTE_ORDER_H_

#include <cstdint>

namespace feedline {

inline uint32_t Le16(const uint8_t* p) { return uint32_t{p[0]} | (uint32_t{p[1]} << 8); }
inline uint32_t Le32(const uint8_t* p) { return Le16(p) | (Le16(p + 2) << 16); }
inline uint32_t Be16(const uint8_t* p) { return (uint32_t{p[0]} << 8) | uint32_t{p[1]}; }
inline uint32_t Be32(const uint8_t* p) { return (Be16(p) << 16) | Be16(p + 2); }

}  // namespace feedline

#endif  // FEEDLINE_SRC_IMAGE_BYTE_ORDER_H_
