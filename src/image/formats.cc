#include "image/formats.h"

#include <gif_lib.h>
#include <tiffio.h>
#include <webp/decode.h>
#include <webp/demux.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "image/byte_order.h"

namespace feedline {
namespace {

absl::Status Corrupt(ImageFormat f, absl::string_view why) {
  return absl::DataLossError(absl::StrCat("corrupt ", FormatName(f), ": ", why));
}
absl::Status Unsupported(ImageFormat f, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(FormatName(f), ": ", why, " (not supported)"));
}
absl::Status CheckSize(ImageFormat f, int64_t w, int64_t h, int64_t max_pixels) {
  if (w <= 0 || h <= 0) return Corrupt(f, absl::StrCat("invalid dimensions ", w, "x", h));
  if (w * h > max_pixels) return ImageTooLarge(w, h, max_pixels);
  return absl::OkStatus();
}

// --- WebP -------------------------------------------------------------------------------------
// Through libwebp's animation decoder, as PIL reads every WebP (still ones are one frame): the
// first frame on a canvas of the image's size, RGBA, then alpha dropped.

absl::StatusOr<ImageSize> WebpHeader(const uint8_t* data, size_t size) {
  WebPBitstreamFeatures f;
  if (WebPGetFeatures(data, size, &f) != VP8_STATUS_OK) {
    return Corrupt(ImageFormat::kWebp, "unreadable header");
  }
  return ImageSize{f.width, f.height};
}

absl::StatusOr<ImageSize> DecodeWebp(const uint8_t* data, size_t size, int64_t max_pixels,
                                     std::vector<uint8_t>* rgb) {
  absl::StatusOr<ImageSize> s = WebpHeader(data, size);
  if (!s.ok()) return s.status();
  if (absl::Status c = CheckSize(ImageFormat::kWebp, s->width, s->height, max_pixels); !c.ok())
    return c;
  WebPAnimDecoderOptions options;
  if (!WebPAnimDecoderOptionsInit(&options)) return absl::InternalError("WebP: libwebp mismatch");
  options.color_mode = MODE_RGBA;
  options.use_threads = 0;  // the decoder workers are the parallelism
  WebPData webp{data, size};
  WebPAnimDecoder* dec = WebPAnimDecoderNew(&webp, &options);
  if (dec == nullptr) return Corrupt(ImageFormat::kWebp, "not decodable");
  struct Free {
    WebPAnimDecoder* d;
    ~Free() { WebPAnimDecoderDelete(d); }
  } free_dec{dec};
  WebPAnimInfo info;
  if (!WebPAnimDecoderGetInfo(dec, &info)) return Corrupt(ImageFormat::kWebp, "no image info");
  const int64_t w = info.canvas_width, h = info.canvas_height;
  if (absl::Status c = CheckSize(ImageFormat::kWebp, w, h, max_pixels); !c.ok()) return c;
  uint8_t* frame = nullptr;
  int timestamp = 0;
  if (!WebPAnimDecoderGetNext(dec, &frame, &timestamp) || frame == nullptr) {
    return Corrupt(ImageFormat::kWebp, "the first frame does not decode");
  }
  rgb->resize(size_t(w) * size_t(h) * 3);
  const size_t n = size_t(w) * size_t(h);
  uint8_t* out = rgb->data();
  for (size_t i = 0; i < n; ++i) {
    out[3 * i] = frame[4 * i];
    out[3 * i + 1] = frame[4 * i + 1];
    out[3 * i + 2] = frame[4 * i + 2];
  }
  return ImageSize{int(w), int(h)};
}

// --- GIF --------------------------------------------------------------------------------------
// The first frame, as PIL shows it: a canvas of the logical screen (grown to the frame if the
// frame reaches past it) filled with the transparent index when the frame has one (else 0), the
// frame's indices over it, then the palette (the frame's own, else the global one; none: the
// index is a grey level). Transparency is not applied: convert("RGB") ignores it.

struct GifInput {
  const uint8_t* data;
  size_t size;
  size_t at;
};
int GifRead(GifFileType* gif, GifByteType* buf, int n) {
  auto* in = static_cast<GifInput*>(gif->UserData);
  const size_t k = std::min(size_t(std::max(n, 0)), in->size - in->at);
  std::memcpy(buf, in->data + in->at, k);
  in->at += k;
  return int(k);
}

struct GifCloser {
  GifFileType* g;
  ~GifCloser() {
    int e = 0;
    if (g != nullptr) DGifCloseFile(g, &e);
  }
};

absl::Status GifError(GifFileType* gif, absl::string_view what) {
  const char* msg = GifErrorString(gif->Error);
  return Corrupt(ImageFormat::kGif, absl::StrCat(what, ": ", msg ? msg : "unknown error"));
}

// Reads the records before the first frame up to and including its descriptor. The image is
// the logical screen grown to the frame where the frame reaches past it (PIL's size).
struct GifFirst {
  int64_t width = 0, height = 0;
  int transparent = -1;  // the first frame's transparent index, if any
};
absl::StatusOr<GifFirst> GifToFirstFrame(GifFileType* gif) {
  GifFirst first;
  for (;;) {
    GifRecordType type;
    if (DGifGetRecordType(gif, &type) == GIF_ERROR) return GifError(gif, "reading a record");
    if (type == TERMINATE_RECORD_TYPE) return Corrupt(ImageFormat::kGif, "no image in the file");
    if (type == EXTENSION_RECORD_TYPE) {
      int code = 0;
      GifByteType* ext = nullptr;
      if (DGifGetExtension(gif, &code, &ext) == GIF_ERROR) return GifError(gif, "an extension");
      if (code == GRAPHICS_EXT_FUNC_CODE && ext != nullptr && ext[0] >= 4) {
        first.transparent = (ext[1] & 1) ? int(ext[4]) : -1;
      }
      while (ext != nullptr) {
        if (DGifGetExtensionNext(gif, &ext) == GIF_ERROR) return GifError(gif, "an extension");
      }
      continue;
    }
    if (type != IMAGE_DESC_RECORD_TYPE) continue;
    if (DGifGetImageDesc(gif) == GIF_ERROR) return GifError(gif, "the image descriptor");
    const GifImageDesc& d = gif->Image;
    if (d.Width <= 0 || d.Height <= 0) return Corrupt(ImageFormat::kGif, "empty first frame");
    first.width = std::max<int64_t>(gif->SWidth, int64_t{d.Left} + d.Width);
    first.height = std::max<int64_t>(gif->SHeight, int64_t{d.Top} + d.Height);
    return first;
  }
}

absl::StatusOr<ImageSize> GifHeader(const uint8_t* data, size_t size) {
  if (size < 10) return Corrupt(ImageFormat::kGif, "header truncated");
  GifInput input{data, size, 0};
  int err = 0;
  GifFileType* gif = DGifOpen(&input, &GifRead, &err);
  if (gif == nullptr) return Corrupt(ImageFormat::kGif, GifErrorString(err));
  GifCloser close_gif{gif};
  absl::StatusOr<GifFirst> first = GifToFirstFrame(gif);
  if (!first.ok()) return first.status();
  return ImageSize{int(std::min<int64_t>(first->width, INT32_MAX)),
                   int(std::min<int64_t>(first->height, INT32_MAX))};
}

absl::StatusOr<ImageSize> DecodeGif(const uint8_t* data, size_t size, int64_t max_pixels,
                                    std::vector<uint8_t>* rgb) {
  if (size < 10) return Corrupt(ImageFormat::kGif, "header truncated");
  GifInput input{data, size, 0};
  int err = 0;
  GifFileType* gif = DGifOpen(&input, &GifRead, &err);
  if (gif == nullptr) return Corrupt(ImageFormat::kGif, GifErrorString(err));
  GifCloser close_gif{gif};
  absl::StatusOr<GifFirst> first = GifToFirstFrame(gif);
  if (!first.ok()) return first.status();
  const int64_t w = first->width, h = first->height;
  if (absl::Status c = CheckSize(ImageFormat::kGif, w, h, max_pixels); !c.ok()) return c;
  const int transparent = first->transparent;
  const GifImageDesc& d = gif->Image;
  const int64_t x0 = d.Left, y0 = d.Top, fw = d.Width, fh = d.Height;
  std::vector<uint8_t> index(size_t(w) * size_t(h), uint8_t(transparent >= 0 ? transparent : 0));
  // Interlaced frames store rows in four passes: every 8th from 0, every 8th from 4, every
  // 4th from 2, every 2nd from 1.
  static const int kStart[4] = {0, 4, 2, 1}, kStep[4] = {8, 8, 4, 2};
  std::vector<GifPixelType> line(static_cast<size_t>(fw));
  auto put = [&](int64_t row) {
    std::memcpy(index.data() + size_t(y0 + row) * size_t(w) + size_t(x0), line.data(), size_t(fw));
  };
  if (d.Interlace) {
    for (int pass = 0; pass < 4; ++pass) {
      for (int64_t r = kStart[pass]; r < fh; r += kStep[pass]) {
        if (DGifGetLine(gif, line.data(), int(fw)) == GIF_ERROR) return GifError(gif, "pixel data");
        put(r);
      }
    }
  } else {
    for (int64_t r = 0; r < fh; ++r) {
      if (DGifGetLine(gif, line.data(), int(fw)) == GIF_ERROR) return GifError(gif, "pixel data");
      put(r);
    }
  }
  const ColorMapObject* map = d.ColorMap != nullptr ? d.ColorMap : gif->SColorMap;
  uint8_t palette[256][3] = {};  // entries past the colour table are black, as in PIL
  for (int i = 0; i < 256; ++i) {
    if (map == nullptr) {
      palette[i][0] = palette[i][1] = palette[i][2] = uint8_t(i);
    } else if (i < map->ColorCount) {
      palette[i][0] = map->Colors[i].Red;
      palette[i][1] = map->Colors[i].Green;
      palette[i][2] = map->Colors[i].Blue;
    }
  }
  rgb->resize(index.size() * 3);
  for (size_t i = 0; i < index.size(); ++i) std::memcpy(rgb->data() + 3 * i, palette[index[i]], 3);
  return ImageSize{int(w), int(h)};
}

// --- TIFF -------------------------------------------------------------------------------------
// libtiff's RGBA interface reads every photometric interpretation, bit depth and compression it
// supports into 8-bit RGBA, top row first; alpha dropped. Only the first directory (page).

struct TiffInput {
  const uint8_t* data;
  size_t size;
  uint64_t at;
  std::string error;  // the first error libtiff reported
};
tmsize_t TiffRead(thandle_t h, void* buf, tmsize_t n) {
  auto* in = static_cast<TiffInput*>(h);
  if (n < 0 || in->at >= in->size) return 0;
  const size_t k = std::min<size_t>(size_t(n), in->size - size_t(in->at));
  std::memcpy(buf, in->data + in->at, k);
  in->at += k;
  return tmsize_t(k);
}
tmsize_t TiffWrite(thandle_t, void*, tmsize_t) { return 0; }
toff_t TiffSeek(thandle_t h, toff_t off, int whence) {
  auto* in = static_cast<TiffInput*>(h);
  uint64_t base = whence == SEEK_CUR ? in->at : whence == SEEK_END ? in->size : 0;
  in->at = base + off;
  return in->at;
}
int TiffClose(thandle_t) { return 0; }
toff_t TiffSize(thandle_t h) { return static_cast<TiffInput*>(h)->size; }
int TiffMap(thandle_t, void**, toff_t*) { return 0; }
void TiffUnmap(thandle_t, void*, toff_t) {}
int TiffOnError(TIFF*, void* user, const char* module, const char* fmt, va_list ap) {
  auto* in = static_cast<TiffInput*>(user);
  if (in->error.empty()) {
    char buf[512];
    std::vsnprintf(buf, sizeof(buf), fmt, ap);
    in->error = module != nullptr ? absl::StrCat(module, ": ", buf) : std::string(buf);
  }
  return 1;  // handled: nothing reaches libtiff's process-wide handler (stderr)
}
int TiffOnWarning(TIFF*, void*, const char*, const char*, va_list) { return 1; }

struct TiffHandle {
  TIFF* tif = nullptr;
  TIFFOpenOptions* options = nullptr;
  ~TiffHandle() {
    if (tif != nullptr) TIFFClose(tif);
    if (options != nullptr) TIFFOpenOptionsFree(options);
  }
};

absl::Status OpenTiff(TiffInput* in, TiffHandle* h) {
  h->options = TIFFOpenOptionsAlloc();
  if (h->options == nullptr) return absl::ResourceExhaustedError("TIFF: out of memory");
  TIFFOpenOptionsSetErrorHandlerExtR(h->options, &TiffOnError, in);
  TIFFOpenOptionsSetWarningHandlerExtR(h->options, &TiffOnWarning, in);
  TIFFOpenOptionsSetMaxSingleMemAlloc(h->options, tmsize_t{1} << 30);
  // "rm": read-only, no memory mapping (the bytes are already in memory).
  h->tif = TIFFClientOpenExt("image", "rm", in, &TiffRead, &TiffWrite, &TiffSeek, &TiffClose,
                             &TiffSize, &TiffMap, &TiffUnmap, h->options);
  if (h->tif == nullptr) {
    return Corrupt(ImageFormat::kTiff, in->error.empty() ? "unreadable header" : in->error);
  }
  return absl::OkStatus();
}

absl::StatusOr<ImageSize> TiffHeader(const uint8_t* data, size_t size) {
  TiffInput in{data, size, 0, {}};
  TiffHandle h;
  if (absl::Status s = OpenTiff(&in, &h); !s.ok()) return s;
  uint32_t w = 0, hh = 0;
  TIFFGetField(h.tif, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(h.tif, TIFFTAG_IMAGELENGTH, &hh);
  return ImageSize{int(std::min<uint32_t>(w, INT32_MAX)), int(std::min<uint32_t>(hh, INT32_MAX))};
}

absl::StatusOr<ImageSize> DecodeTiff(const uint8_t* data, size_t size, int64_t max_pixels,
                                     std::vector<uint8_t>* rgb) {
  TiffInput in{data, size, 0, {}};
  TiffHandle h;
  if (absl::Status s = OpenTiff(&in, &h); !s.ok()) return s;
  uint32_t w = 0, hh = 0;
  TIFFGetField(h.tif, TIFFTAG_IMAGEWIDTH, &w);
  TIFFGetField(h.tif, TIFFTAG_IMAGELENGTH, &hh);
  if (absl::Status c = CheckSize(ImageFormat::kTiff, w, hh, max_pixels); !c.ok()) return c;
  // 8-bit RGB or grey in strips, with or without alpha: the samples as they are (libtiff's
  // RGBA interface would premultiply them by an unassociated alpha, which PIL does not).
  uint16_t bps = 0, spp = 0, photometric = 0, planar = PLANARCONFIG_CONTIG;
  TIFFGetFieldDefaulted(h.tif, TIFFTAG_BITSPERSAMPLE, &bps);
  TIFFGetFieldDefaulted(h.tif, TIFFTAG_SAMPLESPERPIXEL, &spp);
  TIFFGetFieldDefaulted(h.tif, TIFFTAG_PLANARCONFIG, &planar);
  const bool has_photometric = TIFFGetField(h.tif, TIFFTAG_PHOTOMETRIC, &photometric) == 1;
  const bool rgb_like = has_photometric && photometric == PHOTOMETRIC_RGB && spp >= 3;
  const bool grey_like = has_photometric && photometric == PHOTOMETRIC_MINISBLACK && spp >= 1;
  if (bps == 8 && planar == PLANARCONFIG_CONTIG && !TIFFIsTiled(h.tif) && (rgb_like || grey_like)) {
    const tmsize_t line = TIFFScanlineSize(h.tif);
    if (line < tmsize_t(w) * spp) return Corrupt(ImageFormat::kTiff, "scanline size");
    std::vector<uint8_t> row(static_cast<size_t>(line));
    rgb->resize(size_t(w) * size_t(hh) * 3);
    for (uint32_t y = 0; y < hh; ++y) {
      if (TIFFReadScanline(h.tif, row.data(), y, 0) < 0) {
        return Corrupt(ImageFormat::kTiff, in.error.empty() ? "pixel data" : in.error);
      }
      uint8_t* out = rgb->data() + size_t(y) * w * 3;
      for (uint32_t x = 0; x < w; ++x) {
        const uint8_t* px = row.data() + size_t(x) * spp;
        out[3 * x] = px[0];
        out[3 * x + 1] = rgb_like ? px[1] : px[0];
        out[3 * x + 2] = rgb_like ? px[2] : px[0];
      }
    }
    return ImageSize{int(w), int(hh)};
  }
  char why[1024] = "";
  if (!TIFFRGBAImageOK(h.tif, why)) return Unsupported(ImageFormat::kTiff, why);
  std::vector<uint32_t> raster(size_t(w) * size_t(hh));
  if (!TIFFReadRGBAImageOriented(h.tif, w, hh, raster.data(), ORIENTATION_TOPLEFT,
                                 /*stop_on_error=*/1)) {
    return Corrupt(ImageFormat::kTiff, in.error.empty() ? "pixel data" : in.error);
  }
  rgb->resize(raster.size() * 3);
  for (size_t i = 0; i < raster.size(); ++i) {
    (*rgb)[3 * i] = uint8_t(TIFFGetR(raster[i]));
    (*rgb)[3 * i + 1] = uint8_t(TIFFGetG(raster[i]));
    (*rgb)[3 * i + 2] = uint8_t(TIFFGetB(raster[i]));
  }
  return ImageSize{int(w), int(hh)};
}

// --- BMP --------------------------------------------------------------------------------------
// Windows and OS/2 bitmaps: 1/4/8-bit palettes (uncompressed or RLE), 16/24/32-bit direct
// colour (5-5-5 and 8-8-8 by default, or explicit bit fields), bottom-up or top-down rows.

struct BmpInfo {
  int64_t width = 0, height = 0;
  bool top_down = false;
  int bits = 0;
  uint32_t compression = 0;  // 0 RGB, 1 RLE8, 2 RLE4, 3 bit fields, 6 bit fields with alpha
  uint32_t masks[3] = {0, 0, 0};
  size_t palette_at = 0, palette_entry = 4;
  uint32_t colors = 0;
  size_t pixels_at = 0;
};

absl::StatusOr<BmpInfo> ParseBmp(const uint8_t* d, size_t n) {
  const ImageFormat f = ImageFormat::kBmp;
  if (n < 18) return Corrupt(f, "header truncated");
  BmpInfo b;
  b.pixels_at = Le32(d + 10);
  const uint32_t hs = Le32(d + 14);
  if (hs != 12 && hs != 40 && hs != 52 && hs != 56 && hs != 64 && hs != 108 && hs != 124) {
    return Unsupported(f, absl::StrCat("a ", hs, "-byte info header"));
  }
  if (n < 14 + size_t(hs)) return Corrupt(f, "header truncated");
  const uint8_t* h = d + 14;
  if (hs == 12) {
    b.width = Le16(h + 4);
    b.height = Le16(h + 6);
    b.bits = int(Le16(h + 10));
    b.palette_entry = 3;
  } else {
    b.width = int32_t(Le32(h + 4));
    const int32_t height = int32_t(Le32(h + 8));
    b.top_down = height < 0;
    b.height = b.top_down ? -int64_t{height} : height;
    b.bits = int(Le16(h + 14));
    b.compression = Le32(h + 16);
    b.colors = Le32(h + 32);
  }
  b.palette_at = 14 + hs;
  if (b.compression == 3 || b.compression == 6) {
    if (hs >= 52) {
      for (int i = 0; i < 3; ++i) b.masks[i] = Le32(h + 40 + 4 * i);
    } else {
      const size_t extra = b.compression == 6 ? 16 : 12;
      if (n < b.palette_at + extra) return Corrupt(f, "bit fields truncated");
      for (int i = 0; i < 3; ++i) b.masks[i] = Le32(d + b.palette_at + 4 * size_t(i));
      b.palette_at += extra;
    }
    if (b.bits != 16 && b.bits != 32 && b.bits != 24) return Corrupt(f, "bit fields at this depth");
  } else if (b.compression == 1 && b.bits != 8) {
    return Corrupt(f, "RLE8 needs 8 bits per pixel");
  } else if (b.compression == 2 && b.bits != 4) {
    return Corrupt(f, "RLE4 needs 4 bits per pixel");
  } else if (b.compression > 3 && b.compression != 6) {
    return Unsupported(f, absl::StrCat("compression ", b.compression, " (embedded JPEG/PNG)"));
  }
  if (b.bits != 1 && b.bits != 4 && b.bits != 8 && b.bits != 16 && b.bits != 24 && b.bits != 32)
    return Unsupported(f, absl::StrCat(b.bits, " bits per pixel"));
  if (b.bits <= 8 && (b.colors == 0 || b.colors > (1u << b.bits))) b.colors = 1u << b.bits;
  return b;
}

absl::StatusOr<ImageSize> BmpHeader(const uint8_t* d, size_t n) {
  absl::StatusOr<BmpInfo> b = ParseBmp(d, n);
  if (!b.ok()) return b.status();
  return ImageSize{int(std::min<int64_t>(b->width, INT32_MAX)),
                   int(std::min<int64_t>(b->height, INT32_MAX))};
}

// Scales a `mask`ed field of `v` to 8 bits as PIL unpacks 5/6/8-bit fields: x * 255 / max.
struct Field {
  int shift = 0;
  uint32_t max = 0;
  explicit Field(uint32_t mask) {
    if (mask == 0) return;
    while (((mask >> shift) & 1) == 0) ++shift;
    max = mask >> shift;
  }
  uint8_t operator()(uint32_t v) const {
    if (max == 0) return 0;
    return uint8_t(uint64_t((v >> shift) & max) * 255 / max);
  }
};

absl::StatusOr<ImageSize> DecodeBmp(const uint8_t* d, size_t n, int64_t max_pixels,
                                    std::vector<uint8_t>* rgb) {
  const ImageFormat f = ImageFormat::kBmp;
  absl::StatusOr<BmpInfo> parsed = ParseBmp(d, n);
  if (!parsed.ok()) return parsed.status();
  const BmpInfo& b = *parsed;
  if (absl::Status c = CheckSize(f, b.width, b.height, max_pixels); !c.ok()) return c;
  const size_t w = size_t(b.width), h = size_t(b.height);
  uint8_t palette[256][3] = {};  // missing entries are black
  if (b.bits <= 8) {
    if (b.palette_at + size_t(b.colors) * b.palette_entry > n)
      return Corrupt(f, "palette truncated");
    for (uint32_t i = 0; i < b.colors; ++i) {
      const uint8_t* e = d + b.palette_at + i * b.palette_entry;  // B, G, R(, reserved)
      palette[i][0] = e[2], palette[i][1] = e[1], palette[i][2] = e[0];
    }
  }
  if (b.pixels_at > n) return Corrupt(f, "pixel data offset past the end of the file");
  const uint8_t* px = d + b.pixels_at;
  const size_t avail = n - b.pixels_at;
  rgb->assign(w * h * 3, 0);
  // File row r is image row (top_down ? r : h - 1 - r).
  auto out_row = [&](size_t r) { return rgb->data() + (b.top_down ? r : h - 1 - r) * w * 3; };

  if (b.compression == 1 || b.compression == 2) {
    // Run-length coded indices; pixels the data never sets stay index 0.
    std::vector<uint8_t> idx(w * h, 0);
    const bool rle4 = b.compression == 2;
    size_t x = 0, y = 0, at = 0;
    bool ended = false;  // the end-of-bitmap code, or every row written
    auto set = [&](uint8_t v) {
      if (x < w && y < h) idx[y * w + x] = v;
      ++x;
    };
    while (at + 1 < avail && y < h) {
      const uint8_t count = px[at], value = px[at + 1];
      at += 2;
      if (count > 0) {
        for (int i = 0; i < count; ++i) set(rle4 ? ((i & 1) ? value & 15 : value >> 4) : value);
      } else if (value == 0) {  // end of line
        x = 0, ++y;
      } else if (value == 1) {  // end of bitmap
        ended = true;
        break;
      } else if (value == 2) {  // delta
        if (at + 1 >= avail) break;
        x += px[at], y += px[at + 1];
        at += 2;
      } else {  // absolute: `value` literal indices, padded to a 16-bit boundary
        const size_t bytes = rle4 ? (size_t(value) + 1) / 2 : value;
        if (at + bytes > avail) return Corrupt(f, "RLE data truncated");
        for (int i = 0; i < value; ++i) {
          set(rle4 ? ((i & 1) ? px[at + size_t(i / 2)] & 15 : px[at + size_t(i / 2)] >> 4)
                   : px[at + size_t(i)]);
        }
        at += bytes + (bytes & 1);
      }
    }
    // Data that stops before the end-of-bitmap code and before the last row lost its end (PIL
    // refuses it too: "not enough image data").
    if (!ended && y < h) return Corrupt(f, "RLE data truncated (no end-of-bitmap code)");
    for (size_t r = 0; r < h; ++r) {
      uint8_t* o = out_row(r);
      for (size_t c = 0; c < w; ++c) std::memcpy(o + 3 * c, palette[idx[r * w + c]], 3);
    }
    return ImageSize{int(w), int(h)};
  }

  const size_t stride = ((w * size_t(b.bits) + 31) / 32) * 4;
  if (stride * h > avail) return Corrupt(f, "pixel data truncated");
  const bool fields = b.compression == 3 || b.compression == 6;
  const uint32_t* m = b.masks;
  const uint32_t def16[3] = {0x7C00, 0x03E0, 0x001F}, def32[3] = {0xFF0000, 0xFF00, 0xFF};
  const uint32_t* masks = fields ? m : (b.bits == 16 ? def16 : def32);
  const Field fr(masks[0]), fg(masks[1]), fb(masks[2]);
  for (size_t r = 0; r < h; ++r) {
    const uint8_t* in = px + r * stride;
    uint8_t* o = out_row(r);
    for (size_t c = 0; c < w; ++c) {
      if (b.bits <= 8) {
        const int per = 8 / b.bits;
        const int v = (in[c / size_t(per)] >> ((per - 1 - int(c % size_t(per))) * b.bits)) &
                      ((1 << b.bits) - 1);
        std::memcpy(o + 3 * c, palette[v], 3);
      } else if (b.bits == 24 && !fields) {
        o[3 * c] = in[3 * c + 2], o[3 * c + 1] = in[3 * c + 1], o[3 * c + 2] = in[3 * c];
      } else {
        const uint32_t v = b.bits == 16   ? Le16(in + 2 * c)
                           : b.bits == 24 ? (Le16(in + 3 * c) | (uint32_t{in[3 * c + 2]} << 16))
                                          : Le32(in + 4 * c);
        o[3 * c] = fr(v), o[3 * c + 1] = fg(v), o[3 * c + 2] = fb(v);
      }
    }
  }
  return ImageSize{int(w), int(h)};
}

// --- PPM / PGM / PBM --------------------------------------------------------------------------
// P1-P6 (plain and raw). Values are scaled to 8 bits as PIL scales them: round(v / maxval * 255)
// (half to even), clamped; PBM 1 = black.

// Whitespace and comments ('#' to the end of the line) between a PNM's numbers.
void SkipSpaceAndComments(const uint8_t* d, size_t n, size_t* at) {
  while (*at < n) {
    if (d[*at] == '#') {
      while (*at < n && d[*at] != '\n' && d[*at] != '\r') ++*at;
    } else if (std::isspace(d[*at])) {
      ++*at;
    } else {
      return;
    }
  }
}

struct PnmInfo {
  int kind = 0;  // 1..6
  int64_t width = 0, height = 0;
  int maxval = 1;
  size_t data_at = 0;
};

absl::StatusOr<PnmInfo> ParsePnm(const uint8_t* d, size_t n) {
  const ImageFormat f = ImageFormat::kPnm;
  PnmInfo p;
  p.kind = d[1] - '0';
  size_t at = 2;
  const int fields = (p.kind == 1 || p.kind == 4) ? 2 : 3;
  int64_t v[3] = {0, 0, 1};
  for (int i = 0; i < fields; ++i) {
    SkipSpaceAndComments(d, n, &at);
    if (at >= n) return Corrupt(f, "header truncated");
    if (!std::isdigit(d[at])) return Corrupt(f, "a header field is not a number");
    int64_t x = 0;
    while (at < n && std::isdigit(d[at])) {
      x = x * 10 + (d[at++] - '0');
      if (x > (int64_t{1} << 31)) return Corrupt(f, "a header field is too large");
    }
    v[i] = x;
  }
  if (at >= n || !std::isspace(d[at])) return Corrupt(f, "header truncated");
  p.data_at = at + 1;  // exactly one whitespace byte before raw data
  p.width = v[0], p.height = v[1];
  p.maxval = int(v[2]);
  if (p.maxval <= 0 || p.maxval > 65535) return Corrupt(f, "maxval must be in 1..65535");
  return p;
}

absl::StatusOr<ImageSize> PnmHeader(const uint8_t* d, size_t n) {
  absl::StatusOr<PnmInfo> p = ParsePnm(d, n);
  if (!p.ok()) return p.status();
  return ImageSize{int(std::min<int64_t>(p->width, INT32_MAX)),
                   int(std::min<int64_t>(p->height, INT32_MAX))};
}

absl::StatusOr<ImageSize> DecodePnm(const uint8_t* d, size_t n, int64_t max_pixels,
                                    std::vector<uint8_t>* rgb) {
  const ImageFormat f = ImageFormat::kPnm;
  absl::StatusOr<PnmInfo> parsed = ParsePnm(d, n);
  if (!parsed.ok()) return parsed.status();
  const PnmInfo& p = *parsed;
  if (absl::Status c = CheckSize(f, p.width, p.height, max_pixels); !c.ok()) return c;
  const size_t w = size_t(p.width), h = size_t(p.height), pixels = w * h;
  const int channels = (p.kind == 3 || p.kind == 6) ? 3 : 1;
  const size_t samples = pixels * size_t(channels);
  // 8-bit lookup of every sample value (maxval + 1 entries).
  std::vector<uint8_t> scale(size_t(p.maxval) + 1);
  for (int v = 0; v <= p.maxval; ++v) {
    scale[size_t(v)] = uint8_t(std::min(255.0, std::nearbyint(double(v) / p.maxval * 255.0)));
  }
  std::vector<uint8_t> values(samples);
  size_t at = p.data_at;
  if (p.kind == 4) {  // packed bits, rows padded to bytes, 1 = black
    const size_t stride = (w + 7) / 8;
    if (at + stride * h > n) return Corrupt(f, "pixel data truncated");
    for (size_t r = 0; r < h; ++r) {
      for (size_t c = 0; c < w; ++c) {
        values[r * w + c] = (d[at + r * stride + c / 8] >> (7 - c % 8)) & 1 ? 0 : 255;
      }
    }
  } else if (p.kind >= 5) {
    const size_t bytes = p.maxval < 256 ? 1 : 2;
    if (at + samples * bytes > n) return Corrupt(f, "pixel data truncated");
    for (size_t i = 0; i < samples; ++i) {
      const uint32_t v =
          bytes == 1 ? d[at + i] : (uint32_t{d[at + 2 * i]} << 8) | d[at + 2 * i + 1];
      values[i] = v > uint32_t(p.maxval) ? 255 : scale[v];
    }
  } else {  // plain (ASCII) numbers; P1 digits need no separators
    for (size_t i = 0; i < samples; ++i) {
      SkipSpaceAndComments(d, n, &at);
      if (at >= n || !std::isdigit(d[at])) return Corrupt(f, "pixel data truncated");
      uint32_t v = 0;
      if (p.kind == 1) {
        v = d[at++] - '0';
        if (v > 1) return Corrupt(f, "a PBM value other than 0 or 1");
        values[i] = v ? 0 : 255;
        continue;
      }
      while (at < n && std::isdigit(d[at])) {
        v = v * 10 + uint32_t(d[at++] - '0');
        if (v > uint32_t(p.maxval)) return Corrupt(f, "a value above maxval");
      }
      values[i] = scale[v];
    }
  }
  rgb->resize(pixels * 3);
  for (size_t i = 0; i < pixels; ++i) {
    for (int c = 0; c < 3; ++c) {
      (*rgb)[3 * i + size_t(c)] = values[channels == 3 ? 3 * i + size_t(c) : i];
    }
  }
  return ImageSize{int(w), int(h)};
}

}  // namespace

absl::Status ImageTooLarge(int64_t w, int64_t h, int64_t max_pixels) {
  return absl::ResourceExhaustedError(absl::StrCat("image of ", w, "x", h, " = ", w * h,
                                                   " pixels exceeds max_image_pixels (", max_pixels,
                                                   "): refused before decoding"));
}

const char* FormatName(ImageFormat format) {
  switch (format) {
    case ImageFormat::kJpeg:
      return "JPEG";
    case ImageFormat::kPng:
      return "PNG";
    case ImageFormat::kWebp:
      return "WebP";
    case ImageFormat::kGif:
      return "GIF";
    case ImageFormat::kTiff:
      return "TIFF";
    case ImageFormat::kBmp:
      return "BMP";
    case ImageFormat::kPnm:
      return "PNM";
  }
  return "image";
}

bool SniffFormat(const uint8_t* d, size_t n, ImageFormat* format) {
  static const uint8_t kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) {
    *format = ImageFormat::kJpeg;
  } else if (n >= 8 && std::memcmp(d, kPng, 8) == 0) {
    *format = ImageFormat::kPng;
  } else if (n >= 12 && std::memcmp(d, "RIFF", 4) == 0 && std::memcmp(d + 8, "WEBP", 4) == 0) {
    *format = ImageFormat::kWebp;
  } else if (n >= 6 && (std::memcmp(d, "GIF87a", 6) == 0 || std::memcmp(d, "GIF89a", 6) == 0)) {
    *format = ImageFormat::kGif;
  } else if (n >= 4 && (std::memcmp(d, "II*\0", 4) == 0 || std::memcmp(d, "MM\0*", 4) == 0)) {
    *format = ImageFormat::kTiff;
  } else if (n >= 2 && d[0] == 'B' && d[1] == 'M') {
    *format = ImageFormat::kBmp;
  } else if (n >= 3 && d[0] == 'P' && d[1] >= '1' && d[1] <= '6' && std::isspace(d[2])) {
    *format = ImageFormat::kPnm;
  } else {
    return false;
  }
  return true;
}

absl::StatusOr<ImageSize> ReadOtherHeader(ImageFormat format, const uint8_t* data, size_t size) {
  switch (format) {
    case ImageFormat::kWebp:
      return WebpHeader(data, size);
    case ImageFormat::kGif:
      return GifHeader(data, size);
    case ImageFormat::kTiff:
      return TiffHeader(data, size);
    case ImageFormat::kBmp:
      return BmpHeader(data, size);
    case ImageFormat::kPnm:
      return PnmHeader(data, size);
    default:
      return absl::InternalError("ReadOtherHeader: JPEG and PNG have their own decoders");
  }
}

absl::StatusOr<ImageSize> DecodeOther(ImageFormat format, const uint8_t* data, size_t size,
                                      int64_t max_pixels, std::vector<uint8_t>* rgb) {
  switch (format) {
    case ImageFormat::kWebp:
      return DecodeWebp(data, size, max_pixels, rgb);
    case ImageFormat::kGif:
      return DecodeGif(data, size, max_pixels, rgb);
    case ImageFormat::kTiff:
      return DecodeTiff(data, size, max_pixels, rgb);
    case ImageFormat::kBmp:
      return DecodeBmp(data, size, max_pixels, rgb);
    case ImageFormat::kPnm:
      return DecodePnm(data, size, max_pixels, rgb);
    default:
      return absl::InternalError("DecodeOther: JPEG and PNG have their own decoders");
  }
}

}  // namespace feedline
