#include "image/exif.h"

#include <cstring>

#include "image/byte_order.h"

namespace feedline {
namespace {

int JpegOrientation(const uint8_t* d, size_t n) {
  // Segments after SOI: FF marker, then a big-endian length that counts itself. APP1 with an
  // "Exif\0\0" header holds the block; the pixel data (SOS) ends the search.
  size_t at = 2;
  while (at + 4 <= n) {
    if (d[at] != 0xFF) return 1;
    const uint8_t marker = d[at + 1];
    if (marker == 0xFF) {  // fill byte
      ++at;
      continue;
    }
    if (marker == 0xDA || marker == 0xD9) return 1;
    const size_t len = (size_t{d[at + 2]} << 8) | d[at + 3];
    if (len < 2 || at + 2 + len > n) return 1;
    const uint8_t* body = d + at + 4;
    if (marker == 0xE1 && len >= 8 && std::memcmp(body, "Exif\0\0", 6) == 0) {
      return ExifOrientation(body + 6, len - 8);
    }
    at += 2 + len;
  }
  return 1;
}

int PngOrientation(const uint8_t* d, size_t n) {
  // Chunks after the signature: length, type, data, CRC; eXIf comes before IDAT.
  size_t at = 8;
  while (at + 12 <= n) {
    const size_t len = Be32(d + at);
    if (len > n - at - 12) return 1;
    const uint8_t* type = d + at + 4;
    if (std::memcmp(type, "IDAT", 4) == 0 || std::memcmp(type, "IEND", 4) == 0) return 1;
    if (std::memcmp(type, "eXIf", 4) == 0) return ExifOrientation(d + at + 8, len);
    at += 12 + len;
  }
  return 1;
}

int WebpOrientation(const uint8_t* d, size_t n) {
  // RIFF chunks after "RIFF" size "WEBP": fourcc, little-endian size, data padded to even.
  size_t at = 12;
  while (at + 8 <= n) {
    const size_t len = Le32(d + at + 4);
    if (len > n - at - 8) return 1;
    if (std::memcmp(d + at, "EXIF", 4) == 0) return ExifOrientation(d + at + 8, len);
    at += 8 + len + (len & 1);
  }
  return 1;
}

}  // namespace

int ExifOrientation(const uint8_t* e, size_t n) {
  if (n >= 6 && std::memcmp(e, "Exif\0\0", 6) == 0) e += 6, n -= 6;  // some writers keep it
  if (n < 8) return 1;
  const bool le = e[0] == 'I' && e[1] == 'I';
  if (!le && !(e[0] == 'M' && e[1] == 'M')) return 1;
  auto u16 = [&](size_t o) { return le ? Le16(e + o) : Be16(e + o); };
  auto u32 = [&](size_t o) { return le ? Le32(e + o) : Be32(e + o); };
  if (u16(2) != 42) return 1;
  const size_t ifd = u32(4);
  if (ifd > n - 2 || ifd < 8) return 1;
  const size_t count = u16(ifd);
  for (size_t i = 0; i < count; ++i) {
    const size_t entry = ifd + 2 + 12 * i;
    if (entry + 12 > n) return 1;
    if (u16(entry) != 0x0112) continue;
    const uint32_t type = u16(entry + 2);
    const uint32_t value = type == 3 ? u16(entry + 8) : type == 4 ? u32(entry + 8) : 0;
    return value >= 1 && value <= 8 ? int(value) : 1;
  }
  return 1;
}

int ReadOrientation(ImageFormat format, const uint8_t* data, size_t size) {
  switch (format) {
    case ImageFormat::kJpeg:
      return JpegOrientation(data, size);
    case ImageFormat::kPng:
      return PngOrientation(data, size);
    case ImageFormat::kWebp:
      return WebpOrientation(data, size);
    default:
      return 1;
  }
}

DecodedRegion ApplyOrientation(const DecodedRegion& r, int orientation, std::vector<uint8_t>* out) {
  if (orientation <= 1 || orientation > 8) return r;
  const int64_t w = r.width, h = r.height;
  const bool swap = SwapsAxes(orientation);
  const int64_t ow = swap ? h : w, oh = swap ? w : h;
  out->resize(size_t(ow) * size_t(oh) * 3);
  for (int64_t y = 0; y < oh; ++y) {
    uint8_t* o = out->data() + size_t(y) * size_t(ow) * 3;
    for (int64_t x = 0; x < ow; ++x) {
      int64_t sx = x, sy = y;  // the source pixel of output (x, y), as PIL's transpositions
      switch (orientation) {
        case 2:
          sx = w - 1 - x;
          break;  // FLIP_LEFT_RIGHT
        case 3:
          sx = w - 1 - x, sy = h - 1 - y;
          break;  // ROTATE_180
        case 4:
          sy = h - 1 - y;
          break;  // FLIP_TOP_BOTTOM
        case 5:
          sx = y, sy = x;
          break;  // TRANSPOSE
        case 6:
          sx = y, sy = h - 1 - x;
          break;  // ROTATE_270
        case 7:
          sx = w - 1 - y, sy = h - 1 - x;
          break;  // TRANSVERSE
        case 8:
          sx = w - 1 - y, sy = x;
          break;  // ROTATE_90
      }
      std::memcpy(o + 3 * x, r.pixels + size_t(sy) * r.stride + size_t(sx) * 3, 3);
    }
  }
  DecodedRegion u;
  u.pixels = out->data();
  u.width = int(ow);
  u.height = int(oh);
  u.stride = size_t(ow) * 3;
  u.scale_x = swap ? r.scale_y : r.scale_x;
  u.scale_y = swap ? r.scale_x : r.scale_y;
  return u;
}

}  // namespace feedline
