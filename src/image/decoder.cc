#include "image/decoder.h"

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

// jpeglib.h needs FILE and size_t declared first; jerror.h after it, which declares the
// arithmetic-coding messages only when jconfig.h (via jpeglib.h) says they exist.
// clang-format off
#include <jpeglib.h>
#include <jerror.h>
// clang-format on
#include <spng.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "image/byte_order.h"

namespace feedline {

namespace {

bool HasEndOfImage(const uint8_t* d, size_t n) {
  for (size_t i = n; i >= 2; --i) {  // almost always found in the last two bytes
    if (d[i - 1] == 0xD9 && d[i - 2] == 0xFF) return true;
  }
  return false;
}

absl::Status UnknownFormat(size_t n) {
  if (n == 0) return absl::DataLossError("empty file");
  return absl::InvalidArgumentError(
      "not an image in a supported format (JPEG, PNG, WebP, GIF, TIFF, BMP, PPM/PGM/PBM): "
      "unrecognised content");
}

// Output rows per DCT block row of the smallest component (libjpeg 6b's and 7's names).
int MinDctScaledSize(const jpeg_decompress_struct& cinfo) {
#if JPEG_LIB_VERSION >= 70
  return cinfo.min_DCT_v_scaled_size;
#else
  return cinfo.min_DCT_scaled_size;
#endif
}

}  // namespace

// libjpeg reports errors through a callback that must not return: it longjmps back into
// the decode call, which turns the message into a status. Only C objects and members live
// across the setjmp, so no destructor is skipped.
struct ImageDecoder::Jpeg {
  // Left-over bytes in a scan up to this many are padding: MJPEG frames in the real-world set
  // have 1-17 before their restart markers; damaged scans measured 52 and more.
  static constexpr int kScanPaddingBytes = 32;
  struct ErrorManager {
    jpeg_error_mgr pub;
    jmp_buf jump;
    char message[JMSG_LENGTH_MAX];
    bool accept_corrupt = false;
  };
  jpeg_decompress_struct cinfo;
  ErrorManager err;
  std::vector<JSAMPROW> rows;
  std::vector<JSAMPLE> last_row;  // read_to_end: the last row, read and dropped

  static void ErrorExit(j_common_ptr c) {
    auto* e = reinterpret_cast<ErrorManager*>(c->err);
    (*c->err->format_message)(c, e->message);
    std::longjmp(e->jump, 1);
  }
  // Warnings (level < 0) are libjpeg's reports of damage it worked around. Those about the
  // entropy-coded data (a bad Huffman or arithmetic code, a marker or the end of the file
  // inside a scan, a lost restart, an impossible progression) mean that libjpeg filled in
  // pixels the file does not have: an error, unless `accept_corrupt` (then the image is
  // decoded as PIL decodes it). So is a file that ends early (PIL refuses it too, unless told
  // to LOAD_TRUNCATED_IMAGES, which `accept_corrupt` also is). Junk bytes
  // between segments (JWRN_EXTRANEOUS_DATA before a non-scan marker: common in camera files,
  // which PIL reads), unknown JFIF/Adobe versions and a bad ICC marker leave the pixels intact.
  static bool IsCorruptPixels(j_common_ptr c) {
    const int code = c->err->msg_code;
    if (code == JWRN_EXTRANEOUS_DATA) {
      // Bytes left over in a scan (before a restart marker or the end of the image): a few are
      // encoder padding; more mean the Huffman decoder finished early on damaged data. Junk before
      // other markers lies between segments and leaves the pixels alone.
      const int count = c->err->msg_parm.i[0], marker = c->err->msg_parm.i[1];
      const bool in_scan = (marker >= 0xD0 && marker <= 0xD7) || marker == 0xD9;
      return in_scan && count > kScanPaddingBytes;
    }
    switch (code) {
#if defined(C_ARITH_CODING_SUPPORTED) || defined(D_ARITH_CODING_SUPPORTED)
      case JWRN_ARITH_BAD_CODE:
#endif
      case JWRN_BOGUS_PROGRESSION:
      case JWRN_HIT_MARKER:
      case JWRN_HUFF_BAD_CODE:
      case JWRN_MUST_RESYNC:
      case JWRN_NOT_SEQUENTIAL:
        return true;
      default:
        return false;
    }
  }
  static void EmitMessage(j_common_ptr c, int level) {
    if (level >= 0) return;  // trace messages
    auto* e = reinterpret_cast<ErrorManager*>(c->err);
    if (!e->accept_corrupt && (c->err->msg_code == JWRN_JPEG_EOF || IsCorruptPixels(c))) {
      ErrorExit(c);
    }
    c->err->num_warnings++;
  }

  Jpeg() {
    cinfo.err = jpeg_std_error(&err.pub);
    err.pub.error_exit = &ErrorExit;
    err.pub.emit_message = &EmitMessage;
    err.message[0] = '\0';
    jpeg_create_decompress(&cinfo);
  }
  // A clean decompressor for every image: libjpeg keeps Huffman and quantization tables in the
  // object across images, so a file that defines none (an MJPEG frame relies on the standard
  // Huffman tables) would otherwise decode with its predecessor's. Re-creating costs a few
  // small allocations (~1 us), nothing beside a decode.
  void Reset() {
    jpeg_destroy_decompress(&cinfo);
    jpeg_create_decompress(&cinfo);  // keeps cinfo.err
    err.message[0] = '\0';
  }
  ~Jpeg() { jpeg_destroy_decompress(&cinfo); }
};

ImageDecoder::ImageDecoder() : jpeg_(std::make_unique<Jpeg>()) {}
ImageDecoder::~ImageDecoder() = default;

absl::StatusOr<ImageHeader> ImageDecoder::ReadHeader(const uint8_t* data, size_t size) {
  ImageFormat format;
  if (!SniffFormat(data, size, &format)) return UnknownFormat(size);
  if (format != ImageFormat::kJpeg && format != ImageFormat::kPng) {
    absl::StatusOr<ImageSize> s = ReadOtherHeader(format, data, size);
    if (!s.ok()) return s.status();
    if (s->width <= 0 || s->height <= 0) {
      return absl::DataLossError(
          absl::StrCat("corrupt ", FormatName(format), ": invalid dimensions"));
    }
    return ImageHeader{format, s->width, s->height};
  }
  if (format == ImageFormat::kPng) {
    if (size < 24) return absl::DataLossError("PNG header truncated");
    if (std::memcmp(data + 12, "IHDR", 4) != 0) return absl::DataLossError("PNG: IHDR missing");
    ImageHeader h{ImageFormat::kPng, static_cast<int>(Be32(data + 16)),
                  static_cast<int>(Be32(data + 20))};
    if (h.width <= 0 || h.height <= 0) return absl::DataLossError("PNG: invalid dimensions");
    return h;
  }
  jpeg_->Reset();
  jpeg_->err.accept_corrupt = accept_corrupt_;
  jpeg_decompress_struct& cinfo = jpeg_->cinfo;
  if (setjmp(jpeg_->err.jump)) {
    jpeg_abort_decompress(&cinfo);
    return absl::DataLossError(absl::StrCat("corrupt JPEG: ", jpeg_->err.message));
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  ImageHeader h{ImageFormat::kJpeg, static_cast<int>(cinfo.image_width),
                static_cast<int>(cinfo.image_height)};
  jpeg_abort_decompress(&cinfo);
  return h;
}

absl::StatusOr<DecodedRegion> ImageDecoder::Decode(const uint8_t* data, size_t size,
                                                   const Rect& roi, int min_w, int min_h,
                                                   int64_t max_pixels, bool allow_dct_scaling,
                                                   bool read_to_end) {
  ImageFormat format;
  if (!SniffFormat(data, size, &format)) return UnknownFormat(size);
  if (format == ImageFormat::kPng) return DecodePng(data, size, max_pixels);
  if (format != ImageFormat::kJpeg) return DecodeWhole(format, data, size, max_pixels);
  // Decoding stops after the region's last row, so a truncated file could decode without error
  // when the region misses the lost part: refuse it whatever the region (PIL does too). Entropy
  // data cannot hold FF D9, so a file without it anywhere lost its end.
  if (!accept_corrupt_ && !HasEndOfImage(data, size)) {
    return absl::DataLossError("corrupt JPEG: premature end of data (no end-of-image marker)");
  }

  jpeg_->Reset();
  jpeg_->err.accept_corrupt = accept_corrupt_;
  jpeg_decompress_struct& cinfo = jpeg_->cinfo;
  if (setjmp(jpeg_->err.jump)) {
    jpeg_abort_decompress(&cinfo);
    return absl::DataLossError(absl::StrCat("corrupt JPEG: ", jpeg_->err.message));
  }
  jpeg_mem_src(&cinfo, data, static_cast<unsigned long>(size));
  jpeg_read_header(&cinfo, TRUE);
  const int64_t W = cinfo.image_width, H = cinfo.image_height;
  if (W * H > max_pixels) {
    jpeg_abort_decompress(&cinfo);
    return ImageTooLarge(W, H, max_pixels);
  }
  const bool cmyk = cinfo.jpeg_color_space == JCS_CMYK || cinfo.jpeg_color_space == JCS_YCCK;
  cinfo.out_color_space = cmyk ? JCS_CMYK : JCS_RGB;

  // The smallest DCT scale that keeps the region at least min_w x min_h.
  const double rx = std::clamp(roi.x, 0.0, double(W)), ry = std::clamp(roi.y, 0.0, double(H));
  const double rw = std::clamp(roi.w, 1.0, double(W) - rx),
               rh = std::clamp(roi.h, 1.0, double(H) - ry);
  unsigned num = 8;  // the scale is num / 8
  if (allow_dct_scaling && dct_scaling_ != DctScaling::kNone) {
    for (unsigned n = 1; n < 8; ++n) {
      if (dct_scaling_ == DctScaling::kPowersOfTwo && (n & (n - 1)) != 0) continue;
      if (rw * n / 8 >= min_w && rh * n / 8 >= min_h) {
        num = n;
        break;
      }
    }
    if (dct_scaling_ == DctScaling::kEighths && simd_scale_min_fraction_ < 1.0 &&
        (num == 3 || num >= 5) && num < 8) {
      const unsigned simd = num == 3 ? 2 : 4;  // the largest SIMD scale below
      if (rw * simd / 8 >= simd_scale_min_fraction_ * min_w &&
          rh * simd / 8 >= simd_scale_min_fraction_ * min_h) {
        num = simd;
      }
    }
    // libjpeg-turbo's SIMD IDCTs are for 8/8, 4/8, 2/8 and 1/8. At 6/8 and 7/8 the luma
    // blocks go through C IDCTs, and the chroma ones (4:2:0) through 12x12 and 14x14 ones, as
    // it scales chroma up in the IDCT rather than upsampling: decoding a train crop there
    // took 1.06-1.25 ms against 0.84-0.97 ms at 8/8 (crops of 270 and 320 pixels of the
    // bundled images, decode + bilinear resize to 224, one thread). So 8/8 instead, when the
    // resampler then still shrinks bilinearly (it would average areas beyond that: slower).
    // With the bilinear limit at 1.75 rather than 1.5, this took a train epoch of the bundled
    // set from 0.90x to 0.93x of the 1/8-scale floor (decode + resample, one thread).
    if (dct_scaling_ == DctScaling::kEighths && (num == 6 || num == 7) &&
        rw <= cheap_shrink_max_ * min_w && rh <= cheap_shrink_max_ * min_h) {
      num = 8;
    }
  }
  cinfo.scale_num = num;
  cinfo.scale_denom = 8;
  jpeg_start_decompress(&cinfo);

  const double sx = double(cinfo.output_width) / double(W);
  const double sy = double(cinfo.output_height) / double(H);
  JDIMENSION x0 = static_cast<JDIMENSION>(std::floor(rx * sx));
  JDIMENSION x1 =
      std::min<JDIMENSION>(cinfo.output_width, static_cast<JDIMENSION>(std::ceil((rx + rw) * sx)));
  JDIMENSION y0 = static_cast<JDIMENSION>(std::floor(ry * sy));
  JDIMENSION y1 =
      std::min<JDIMENSION>(cinfo.output_height, static_cast<JDIMENSION>(std::ceil((ry + rh) * sy)));
  if (x1 <= x0) x1 = std::min<JDIMENSION>(x0 + 1, cinfo.output_width);
  if (y1 <= y0) y1 = std::min<JDIMENSION>(y0 + 1, cinfo.output_height);
  JDIMENSION xoff = x0, cw = x1 - x0;
  if (cw < cinfo.output_width) jpeg_crop_scanline(&cinfo, &xoff, &cw);  // aligns to iMCUs
  if (y0 > 0) jpeg_skip_scanlines(&cinfo, y0);

  const int comps = cinfo.output_components;  // 3 (RGB) or 4 (CMYK)
  const JDIMENSION rows = y1 - y0;
  const size_t row_bytes = size_t{cw} * comps;
  pixels_.resize(row_bytes * rows);
  jpeg_->rows.resize(rows);
  for (JDIMENSION r = 0; r < rows; ++r) jpeg_->rows[r] = pixels_.data() + r * row_bytes;
  while (cinfo.output_scanline < y1) {
    JDIMENSION at = cinfo.output_scanline - y0;
    jpeg_read_scanlines(&cinfo, jpeg_->rows.data() + at, rows - at);
  }
  if (read_to_end) {
    // Entropy-decode the rest (no IDCT, no colour conversion) and read up to the end marker:
    // damage there raises the same warnings as in a full decode.
    // libjpeg-turbo skips a range that reaches the last row without decoding it at all, so
    // skip to the row before, then read that last row.
    // libjpeg-turbo 2.1.5's jpeg_skip_scanlines can also loop forever when it starts inside an
    // iMCU row (a fuzzed 3 x 62728 JPEG with 4:1 vertical sampling hung from 29 or 30 rows into
    // one: tests/fuzz/regressions/decode/jpeg_v4_skip_from_inside_an_imcu_row_hangs.jpg), so
    // the rows up to the next iMCU row are read first, and the skip starts on its boundary.
    jpeg_->last_row.resize(size_t{cinfo.output_width} * size_t(cinfo.output_components));
    JSAMPROW row = jpeg_->last_row.data();
    const JDIMENSION imcu_rows = JDIMENSION(cinfo.max_v_samp_factor * MinDctScaledSize(cinfo));
    auto read_while = [&](auto more) -> bool {
      while (more()) {
        if (jpeg_read_scanlines(&cinfo, &row, 1) != 1) return false;  // no progress
      }
      return true;
    };
    bool read = read_while([&] {
      return cinfo.output_scanline % imcu_rows != 0 && cinfo.output_scanline < cinfo.output_height;
    });
    if (read && cinfo.output_scanline + 1 < cinfo.output_height) {
      jpeg_skip_scanlines(&cinfo, cinfo.output_height - 1 - cinfo.output_scanline);
    }
    read = read && read_while([&] { return cinfo.output_scanline < cinfo.output_height; });
    if (!read) {
      jpeg_abort_decompress(&cinfo);
      return absl::DataLossError("corrupt JPEG: no rows past the region");
    }
    jpeg_finish_decompress(&cinfo);
  } else {
    jpeg_abort_decompress(&cinfo);  // stop after the region's last row
  }

  if (cmyk) {
    // CMYK -> RGB as PIL does it: PIL reads every 4-channel JPEG as Adobe-inverted CMYK (stored
    // = 255 - ink, which libjpeg hands back as stored), then R = nk - nk * c / 255 with
    // nk = 255 - k and its rounded division (x + 128 + ((x + 128) >> 8)) >> 8.
    const size_t n = size_t{cw} * rows;
    uint8_t* p = pixels_.data();
    auto muldiv255 = [](int a, int b) {
      const int t = a * b + 128;
      return ((t >> 8) + t) >> 8;
    };
    for (size_t i = 0; i < n; ++i) {
      const int nk = p[4 * i + 3];  // 255 - ink k
      for (int ch = 0; ch < 3; ++ch) {
        const int ink = 255 - p[4 * i + ch];
        p[3 * i + ch] = static_cast<uint8_t>(std::clamp(nk - muldiv255(ink, nk), 0, 255));
      }
    }
  }
  DecodedRegion out;
  out.pixels = pixels_.data();
  out.width = static_cast<int>(cw);
  out.height = static_cast<int>(rows);
  out.stride = size_t{cw} * 3;
  out.scale_x = sx;
  out.scale_y = sy;
  out.origin_x = xoff;
  out.origin_y = y0;
  return out;
}

absl::StatusOr<DecodedRegion> ImageDecoder::DecodeWhole(ImageFormat format, const uint8_t* data,
                                                        size_t size, int64_t max_pixels) {
  absl::StatusOr<ImageSize> s = DecodeOther(format, data, size, max_pixels, &pixels_);
  if (!s.ok()) return s.status();
  DecodedRegion out;
  out.pixels = pixels_.data();
  out.width = s->width;
  out.height = s->height;
  out.stride = size_t(s->width) * 3;
  return out;
}

absl::StatusOr<DecodedRegion> ImageDecoder::DecodePng(const uint8_t* data, size_t size,
                                                      int64_t max_pixels) {
  spng_ctx* ctx = spng_ctx_new(0);
  if (ctx == nullptr) return absl::ResourceExhaustedError("PNG: out of memory");
  struct Free {
    spng_ctx* c;
    ~Free() { spng_ctx_free(c); }
  } free_ctx{ctx};
  // A bad CRC is damage (PIL refuses it too): an error, unless `accept_corrupt` (then the data
  // is used as it is and damaged ancillary chunks are dropped). Ancillary chunks are not
  // needed; their memory is bounded so that a hostile file cannot balloon it.
  if (accept_corrupt_) spng_set_crc_action(ctx, SPNG_CRC_USE, SPNG_CRC_DISCARD);
  spng_set_chunk_limits(ctx, 1 << 24, 1 << 26);
  int rc = spng_set_png_buffer(ctx, data, size);
  spng_ihdr ihdr;
  if (rc == 0) rc = spng_get_ihdr(ctx, &ihdr);
  if (rc != 0) return absl::DataLossError(absl::StrCat("corrupt PNG: ", spng_strerror(rc)));
  if (int64_t{ihdr.width} * ihdr.height > max_pixels) {
    return ImageTooLarge(ihdr.width, ihdr.height, max_pixels);
  }
  size_t out_size = 0;
  rc = spng_decoded_image_size(ctx, SPNG_FMT_RGB8, &out_size);
  if (rc != 0) return absl::DataLossError(absl::StrCat("corrupt PNG: ", spng_strerror(rc)));
  pixels_.resize(out_size);
  rc = spng_decode_image(ctx, pixels_.data(), out_size, SPNG_FMT_RGB8, 0);
  if (rc != 0) return absl::DataLossError(absl::StrCat("corrupt PNG: ", spng_strerror(rc)));
  DecodedRegion out;
  out.pixels = pixels_.data();
  out.width = static_cast<int>(ihdr.width);
  out.height = static_cast<int>(ihdr.height);
  out.stride = size_t{ihdr.width} * 3;
  return out;
}

}  // namespace feedline
