// Writes the decode fuzzer's seed corpus: small JPEGs of every kind the decoder meets (baseline
// and progressive, arithmetic coding, every chroma subsampling, grayscale, CMYK and YCCK,
// restart markers, EXIF/ICC/comment markers, 1x1, thin and odd sizes, a larger image for the
// DCT-scaled ROI path) and PNGs of every colour type and bit depth (interlaced too), made with
// libjpeg and libspng directly, for the variants that higher-level encoders do not expose.
//
// Usage: feedline_fuzz_seeds OUT_DIR     (writes OUT_DIR/*.jpg, *.png; prints the count)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

// jpeglib.h needs FILE and size_t declared first.
#include <jpeglib.h>
#include <spng.h>

namespace {

std::string out_dir;
int written = 0;

void Write(const std::string& name, const void* data, size_t size) {
  const std::string path = out_dir + "/" + name;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr || std::fwrite(data, 1, size, f) != size || std::fclose(f) != 0) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
  ++written;
}

// A deterministic picture with smooth colour, edges and some texture: `comps` samples per pixel.
std::vector<uint8_t> Picture(int w, int h, int comps, int seed) {
  std::vector<uint8_t> px(size_t(w) * h * comps);
  uint32_t s = 2654435761u * uint32_t(seed + 1);
  for (int y = 0; y < h; ++y) {
    for (int x = 0; x < w; ++x) {
      s = s * 1664525u + 1013904223u;
      const int noise = int(s >> 27) - 16;
      const bool inside = (x - w / 3) * (x - w / 3) + (y - h / 2) * (y - h / 2) < (w * h) / 10;
      for (int c = 0; c < comps; ++c) {
        int v =
            (x * 255 / std::max(1, w - 1) * (c + 1) + y * 255 / std::max(1, h - 1) * (3 - c)) / 4;
        if (inside) v = 255 - v;
        v += noise;
        px[(size_t(y) * w + x) * comps + c] = uint8_t(std::clamp(v, 0, 255));
      }
    }
  }
  return px;
}

struct JpegSpec {
  const char* name;
  int w, h;
  J_COLOR_SPACE in_space = JCS_RGB;      // what the pixels are
  J_COLOR_SPACE jpeg_space = JCS_YCbCr;  // what the file stores
  int h0 = 2, v0 = 2;                    // luma sampling factors (chroma 1x1)
  int quality = 75;
  bool progressive = false, arithmetic = false, optimize = false;
  int restart_interval = 0;
  bool markers = false;  // EXIF (orientation 6), ICC profile, comment
  bool adobe = true;     // Adobe marker for CMYK/YCCK (inverted values)
};

void WriteJpeg(const JpegSpec& s) {
  jpeg_compress_struct c;
  jpeg_error_mgr err;
  c.err = jpeg_std_error(&err);  // errors exit: a generator bug, not something to recover from
  jpeg_create_compress(&c);
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  jpeg_mem_dest(&c, &buf, &size);
  c.image_width = JDIMENSION(s.w);
  c.image_height = JDIMENSION(s.h);
  c.in_color_space = s.in_space;
  c.input_components = s.in_space == JCS_GRAYSCALE ? 1 : s.in_space == JCS_CMYK ? 4 : 3;
  jpeg_set_defaults(&c);
  jpeg_set_colorspace(&c, s.jpeg_space);
  jpeg_set_quality(&c, s.quality, TRUE);
  if (c.num_components >= 3) {
    c.comp_info[0].h_samp_factor = s.h0;
    c.comp_info[0].v_samp_factor = s.v0;
    for (int i = 1; i < c.num_components; ++i) {
      c.comp_info[i].h_samp_factor = 1;
      c.comp_info[i].v_samp_factor = 1;
    }
    if (c.num_components == 4) {  // K at full resolution, like Y
      c.comp_info[3].h_samp_factor = s.h0;
      c.comp_info[3].v_samp_factor = s.v0;
    }
  }
  c.arith_code = s.arithmetic;
  c.optimize_coding = s.optimize;
  c.restart_interval = unsigned(s.restart_interval);
  c.write_Adobe_marker = s.adobe;
  if (s.progressive) jpeg_simple_progression(&c);
  jpeg_start_compress(&c, TRUE);
  if (s.markers) {
    // EXIF with orientation 6 (rotate 90): ignored by the decoder, as torchvision ignores it.
    static const uint8_t kExif[] = {'E',  'x',  'i', 'f', 0, 0, 'M', 'M', 0, 42, 0, 0, 0, 8, 0, 1,
                                    0x01, 0x12, 0,   3,   0, 0, 0,   1,   0, 6,  0, 0, 0, 0, 0, 0};
    jpeg_write_marker(&c, JPEG_APP0 + 1, kExif, sizeof(kExif));
    std::vector<uint8_t> icc(200, 0);
    std::memcpy(icc.data(), "ICC_PROFILE\0\x01\x01", 14);
    jpeg_write_marker(&c, JPEG_APP0 + 2, icc.data(), unsigned(icc.size()));
    static const char kComment[] = "feedline fuzz seed";
    jpeg_write_marker(&c, JPEG_COM, reinterpret_cast<const JOCTET*>(kComment),
                      sizeof(kComment) - 1);
  }
  const std::vector<uint8_t> px = Picture(s.w, s.h, c.input_components, s.w * 31 + s.h);
  while (c.next_scanline < c.image_height) {
    JSAMPROW row =
        const_cast<uint8_t*>(px.data()) + size_t(c.next_scanline) * s.w * c.input_components;
    jpeg_write_scanlines(&c, &row, 1);
  }
  jpeg_finish_compress(&c);
  jpeg_destroy_compress(&c);
  Write(std::string(s.name) + ".jpg", buf, size);
  std::free(buf);
}

struct PngSpec {
  const char* name;
  int w, h;
  uint8_t color_type, bit_depth;
  bool interlace = false;
  bool text = false;
};

void WritePng(const PngSpec& s) {
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{};
  ihdr.width = uint32_t(s.w);
  ihdr.height = uint32_t(s.h);
  ihdr.bit_depth = s.bit_depth;
  ihdr.color_type = s.color_type;
  ihdr.interlace_method = s.interlace ? SPNG_INTERLACE_ADAM7 : SPNG_INTERLACE_NONE;
  spng_set_ihdr(ctx, &ihdr);
  int channels = 1;
  switch (s.color_type) {
    case SPNG_COLOR_TYPE_TRUECOLOR:
      channels = 3;
      break;
    case SPNG_COLOR_TYPE_TRUECOLOR_ALPHA:
      channels = 4;
      break;
    case SPNG_COLOR_TYPE_GRAYSCALE_ALPHA:
      channels = 2;
      break;
    default:
      channels = 1;
  }
  if (s.color_type == SPNG_COLOR_TYPE_INDEXED) {
    spng_plte plte{};
    plte.n_entries = 1u << s.bit_depth;
    for (uint32_t i = 0; i < plte.n_entries; ++i) {
      plte.entries[i] =
          spng_plte_entry{uint8_t(i * 37), uint8_t(255 - i * 11), uint8_t(i * 5), 255};
    }
    spng_set_plte(ctx, &plte);
    spng_trns trns{};
    trns.n_type3_entries = 2;
    trns.type3_alpha[0] = 0;
    trns.type3_alpha[1] = 128;
    spng_set_trns(ctx, &trns);
  }
  if (s.text) {
    spng_text text{};
    std::strcpy(text.keyword, "Comment");
    static char value[] = "feedline fuzz seed";  // spng keeps the pointer until encoding
    text.type = SPNG_TEXT;
    text.length = sizeof(value) - 1;
    text.text = value;
    spng_set_text(ctx, &text, 1);
  }
  const size_t row_bytes = (size_t(s.w) * channels * s.bit_depth + 7) / 8;
  const std::vector<uint8_t> px = Picture(int(row_bytes), s.h, 1, s.w * 17 + s.color_type);
  int rc = spng_encode_image(ctx, px.data(), px.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE);
  size_t size = 0;
  void* buf = rc == 0 ? spng_get_png_buffer(ctx, &size, &rc) : nullptr;
  if (buf == nullptr) {
    std::fprintf(stderr, "PNG %s: %s\n", s.name, spng_strerror(rc));
    std::exit(1);
  }
  Write(std::string(s.name) + ".png", buf, size);
  std::free(buf);
  spng_ctx_free(ctx);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  out_dir = argv[1];
  const JpegSpec jpegs[] = {
      {.name = "baseline_420", .w = 48, .h = 40},
      {.name = "baseline_444", .w = 48, .h = 40, .h0 = 1, .v0 = 1, .quality = 90},
      {.name = "baseline_422", .w = 48, .h = 40, .h0 = 2, .v0 = 1},
      {.name = "baseline_440", .w = 48, .h = 40, .h0 = 1, .v0 = 2},
      {.name = "baseline_411", .w = 64, .h = 16, .h0 = 4, .v0 = 1},
      {.name = "odd_size_420", .w = 33, .h = 17},
      {.name = "gray", .w = 40, .h = 32, .in_space = JCS_GRAYSCALE, .jpeg_space = JCS_GRAYSCALE},
      {.name = "progressive_420", .w = 48, .h = 40, .progressive = true},
      {.name = "progressive_444", .w = 40, .h = 24, .h0 = 1, .v0 = 1, .progressive = true},
      {.name = "progressive_gray",
       .w = 40,
       .h = 32,
       .in_space = JCS_GRAYSCALE,
       .jpeg_space = JCS_GRAYSCALE,
       .progressive = true},
      {.name = "arithmetic", .w = 48, .h = 40, .arithmetic = true},
      {.name = "arithmetic_progressive", .w = 32, .h = 32, .progressive = true, .arithmetic = true},
      {.name = "restart_1", .w = 48, .h = 40, .restart_interval = 1},
      {.name = "restart_progressive", .w = 48, .h = 40, .progressive = true, .restart_interval = 2},
      {.name = "optimized_q95", .w = 48, .h = 40, .quality = 95, .optimize = true},
      {.name = "q5", .w = 48, .h = 40, .quality = 5},
      {.name = "markers_exif_icc", .w = 24, .h = 24, .markers = true},
      {.name = "cmyk_adobe",
       .w = 32,
       .h = 24,
       .in_space = JCS_CMYK,
       .jpeg_space = JCS_CMYK,
       .h0 = 1,
       .v0 = 1},
      {.name = "cmyk_plain",
       .w = 32,
       .h = 24,
       .in_space = JCS_CMYK,
       .jpeg_space = JCS_CMYK,
       .h0 = 1,
       .v0 = 1,
       .adobe = false},
      {.name = "ycck", .w = 32, .h = 24, .in_space = JCS_CMYK, .jpeg_space = JCS_YCCK},
      {.name = "one_pixel", .w = 1, .h = 1},
      {.name = "thin_1x300",
       .w = 1,
       .h = 300,
       .in_space = JCS_GRAYSCALE,
       .jpeg_space = JCS_GRAYSCALE},
      {.name = "thin_300x1", .w = 300, .h = 1},
      {.name = "rgb_no_ycc", .w = 24, .h = 24, .jpeg_space = JCS_RGB, .h0 = 1, .v0 = 1},
      // Large enough for the 1/2..1/8 DCT scales, the column crop and skipped rows.
      {.name = "large_420", .w = 256, .h = 192, .quality = 30},
      {.name = "large_progressive", .w = 256, .h = 160, .quality = 30, .progressive = true},
  };
  for (const JpegSpec& s : jpegs) WriteJpeg(s);

  const PngSpec pngs[] = {
      {"rgb8", 24, 16, SPNG_COLOR_TYPE_TRUECOLOR, 8},
      {"rgba8", 24, 16, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA, 8},
      {"rgb16", 16, 12, SPNG_COLOR_TYPE_TRUECOLOR, 16},
      {"gray8", 24, 16, SPNG_COLOR_TYPE_GRAYSCALE, 8},
      {"gray16", 16, 12, SPNG_COLOR_TYPE_GRAYSCALE, 16},
      {"gray1", 33, 9, SPNG_COLOR_TYPE_GRAYSCALE, 1},
      {"gray_alpha8", 16, 16, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA, 8},
      {"palette8", 20, 20, SPNG_COLOR_TYPE_INDEXED, 8},
      {"palette2", 20, 20, SPNG_COLOR_TYPE_INDEXED, 2},
      {"interlaced_rgb8", 19, 13, SPNG_COLOR_TYPE_TRUECOLOR, 8, true},
      {"text_chunk", 8, 8, SPNG_COLOR_TYPE_TRUECOLOR, 8, false, true},
      {"one_pixel", 1, 1, SPNG_COLOR_TYPE_TRUECOLOR, 8},
  };
  for (const PngSpec& s : pngs) WritePng(s);
  std::printf("%d seed images in %s\n", written, out_dir.c_str());
  return 0;
}
