// The decoder on real JPEGs: ROI + DCT-scaled decode against full decode, colour spaces,
// and broken input (which must give an error, never a crash).
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <opencv2/core.hpp>
#include <opencv2/imgproc.hpp>
#include <string>
#include <vector>

#include "feedline/random.h"
#include "image/bilinear.h"
#include "image/decoder.h"
#include "image/geometry.h"
#include "image/pil_resample.h"
#include "test_util.h"

using feedline::DecodedRegion;
using feedline::ImageDecoder;
using feedline::Layout;
using feedline::Rect;
namespace t = feedline::testing;

namespace {
constexpr int64_t kMaxPixels = 100'000'000;

const uint8_t* U8(const std::string& s) { return reinterpret_cast<const uint8_t*>(s.data()); }

// Full-resolution decode of the whole image, then crop + resize: the reference.
std::vector<uint8_t> Reference(ImageDecoder& d, const std::string& jpeg, const Rect& box, int out) {
  auto full = d.Decode(U8(jpeg), jpeg.size(), Rect{0, 0, 1e9, 1e9}, 1, 1, kMaxPixels, false);
  REQUIRE(full.ok());
  std::vector<uint8_t> dst(size_t(out) * out * 3);
  feedline::ResampleScratch scratch;
  feedline::ResampleInto(*full, box, out, out, false, Layout::kNHWC, dst.data(), &scratch);
  return dst;
}
}  // namespace

TEST_CASE("ROI + DCT-scaled decode matches full decode + crop + resize", "[decode]") {
  ImageDecoder d;
  double psnr_min = 99, psnr_sum = 0;
  int psnr_n = 0;
  for (bool s444 : {false, true}) {
    for (bool progressive : {false, true}) {
      const std::string jpeg = t::PhotoJpeg(640, 480, 11, 92, s444, progressive);
      for (int i = 0; i < 24; ++i) {
        feedline::SampleRng rng(1, 0, uint64_t(i), feedline::kRngCrop);
        feedline::CropBox b =
            feedline::RandomResizedCropBox(640, 480, {0.08, 1.0}, {0.75, 4.0 / 3}, rng);
        const Rect box{double(b.left), double(b.top), double(b.width), double(b.height)};
        const int out = 112;  // small output: exercises the 1/2 .. 1/4 scales
        auto region = d.Decode(U8(jpeg), jpeg.size(), box, out, out, kMaxPixels);
        REQUIRE(region.ok());
        REQUIRE(region->width <= 640);
        // The decoded region is no larger than needed: at most one iMCU of slack per side.
        REQUIRE(region->width <= int(b.width * region->scale_x) + 2 * 16 + 2);
        std::vector<uint8_t> fast(size_t(out) * out * 3);
        feedline::ResampleScratch scratch;
        feedline::ResampleInto(*region, box, out, out, false, Layout::kNHWC, fast.data(), &scratch);
        std::vector<uint8_t> ref = Reference(d, jpeg, box, out);
        const double psnr = t::Psnr(fast.data(), ref.data(), fast.size());
        INFO("box " << b.left << "," << b.top << " " << b.width << "x" << b.height << " scale "
                    << region->scale_x << " psnr " << psnr);
        REQUIRE(psnr > 24.0);
        psnr_min = std::min(psnr_min, psnr);
        psnr_sum += psnr;
        ++psnr_n;
      }
    }
  }
  // The synthetic images carry strong per-pixel grain, the worst case for decoding at a
  // reduced DCT scale; photographs score higher.
  REQUIRE(psnr_sum / psnr_n > 29.0);
  WARN("ROI/DCT-scaled vs full decode: PSNR min " << psnr_min << " dB, mean " << psnr_sum / psnr_n
                                                  << " dB");
}

TEST_CASE("train's decoder takes a SIMD scale (4/8, 2/8) that leaves 80% over a C one",
          "[decode]") {
  // (side, the scale taken by default, with a 0.8 fraction), for the whole image at 224.
  struct Case {
    int side;
    double plain, simd;
  };
  for (const Case c : {Case{400, 5.0 / 8, 4.0 / 8},     // 4/8: 200 pixels, 0.89 of 224
                       Case{360, 5.0 / 8, 4.0 / 8},     // 180: 0.80
                       Case{340, 1.0, 1.0},             // 6/8, taken at 8/8; 4/8: 0.76
                       Case{720, 3.0 / 8, 2.0 / 8},     // 2/8: 180
                       Case{640, 3.0 / 8, 3.0 / 8}}) {  // 2/8: 160, 0.71
    const std::string jpeg = t::PhotoJpeg(c.side, c.side, 5, 90);
    const Rect all{0, 0, double(c.side), double(c.side)};
    INFO(c.side << " x " << c.side);
    ImageDecoder plain, simd;
    simd.set_simd_scale_min_fraction(0.8);
    auto a = plain.Decode(U8(jpeg), jpeg.size(), all, 224, 224, kMaxPixels);
    auto b = simd.Decode(U8(jpeg), jpeg.size(), all, 224, 224, kMaxPixels);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    CHECK(a->scale_x == Approx(c.plain));
    CHECK(b->scale_x == Approx(c.simd));
    // Enlarged from the smaller decode, still close to the full decode's resize.
    std::vector<uint8_t> out(size_t(224) * 224 * 3);
    feedline::ResampleScratch scratch;
    feedline::ResampleInto(*b, all, 224, 224, false, Layout::kNHWC, out.data(), &scratch);
    ImageDecoder ref_decoder;
    const std::vector<uint8_t> ref = Reference(ref_decoder, jpeg, all, 224);
    CHECK(t::Psnr(out.data(), ref.data(), out.size()) > 24.0);
  }
}

TEST_CASE("progressive and baseline encodings decode alike", "[decode]") {
  ImageDecoder d;
  const std::string base = t::PhotoJpeg(301, 203, 5, 90, false, false);
  const std::string prog = t::PhotoJpeg(301, 203, 5, 90, false, true);
  auto a = d.Decode(U8(base), base.size(), Rect{0, 0, 301, 203}, 301, 203, kMaxPixels, false);
  REQUIRE(a.ok());
  std::vector<uint8_t> pa(a->pixels, a->pixels + a->stride * size_t(a->height));
  auto b = d.Decode(U8(prog), prog.size(), Rect{0, 0, 301, 203}, 301, 203, kMaxPixels, false);
  REQUIRE(b.ok());
  REQUIRE(b->width == 301);
  REQUIRE(b->height == 203);
  REQUIRE(t::Psnr(pa.data(), b->pixels, pa.size()) > 45.0);
}

TEST_CASE("grayscale JPEGs come out RGB", "[decode]") {
  ImageDecoder d;
  const std::string gray = t::PhotoJpeg(120, 90, 3, 90, false, false, /*gray=*/true);
  auto r = d.Decode(U8(gray), gray.size(), Rect{0, 0, 120, 90}, 120, 90, kMaxPixels);
  REQUIRE(r.ok());
  REQUIRE(r->width == 120);
  for (int i = 0; i < r->width * r->height; ++i) {
    REQUIRE(r->pixels[3 * i] == r->pixels[3 * i + 1]);
    REQUIRE(r->pixels[3 * i] == r->pixels[3 * i + 2]);
  }
}

TEST_CASE("headers: format and size by content, not by name", "[decode]") {
  ImageDecoder d;
  const std::string jpeg = t::PhotoJpeg(77, 33, 1);
  auto h = d.ReadHeader(U8(jpeg), jpeg.size());
  REQUIRE(h.ok());
  REQUIRE(h->format == feedline::ImageFormat::kJpeg);
  REQUIRE(h->width == 77);
  REQUIRE(h->height == 33);
  // A 1x1 image and an extremely thin one decode.
  for (auto [w, hh] : {std::pair{1, 1}, std::pair{1, 700}, std::pair{900, 2}}) {
    const std::string j = t::PhotoJpeg(w, hh, 2);
    auto r = d.Decode(U8(j), j.size(), Rect{0, 0, double(w), double(hh)}, 8, 8, kMaxPixels);
    REQUIRE(r.ok());
    REQUIRE(r->width == w);
    REQUIRE(r->height == hh);
  }
}

TEST_CASE("broken input gives a clear error, never a crash", "[decode]") {
  ImageDecoder d;
  const std::string jpeg = t::PhotoJpeg(200, 150, 9);
  const Rect all{0, 0, 200, 150};
  SECTION("empty") {
    auto r = d.Decode(nullptr, 0, all, 8, 8, kMaxPixels);
    REQUIRE(absl::IsDataLoss(r.status()));
  }
  SECTION("not an image") {
    const std::string text = "hello, this is not an image at all";
    auto r = d.Decode(U8(text), text.size(), all, 8, 8, kMaxPixels);
    REQUIRE(absl::IsInvalidArgument(r.status()));
    REQUIRE(std::string(r.status().message()).find("not an image in a supported format") !=
            std::string::npos);
  }
  SECTION("truncated anywhere") {
    for (size_t cut : {size_t(3), size_t(20), size_t(200), jpeg.size() / 2, jpeg.size() - 10}) {
      auto r = d.Decode(U8(jpeg), cut, all, 8, 8, kMaxPixels);
      INFO("cut at " << cut);
      REQUIRE(!r.ok());
      REQUIRE(absl::IsDataLoss(r.status()));
    }
    // The decoder is reusable after an error.
    REQUIRE(d.Decode(U8(jpeg), jpeg.size(), all, 8, 8, kMaxPixels).ok());
  }
  SECTION("bit flips") {
    feedline::SampleRng rng(42, 0, 0, 0);
    int failures = 0;
    for (int i = 0; i < 300; ++i) {
      std::string bad = jpeg;
      for (int k = 0; k < 4; ++k) bad[rng.Below(bad.size())] ^= char(1 << rng.Below(8));
      auto r = d.Decode(U8(bad), bad.size(), Rect{10, 10, 100, 100}, 20, 20, kMaxPixels);
      if (!r.ok()) ++failures;
    }
    SUCCEED("bit flips: " << failures << " of 300 refused, the rest decoded");
  }
  SECTION("decompression bomb refused before allocating") {
    std::string bomb = jpeg;
    // Patch the SOF0 marker's height and width to 60000 x 60000.
    size_t sof = bomb.find("\xFF\xC0", 2);
    REQUIRE(sof != std::string::npos);
    bomb[sof + 5] = char(0xEA), bomb[sof + 6] = char(0x60);
    bomb[sof + 7] = char(0xEA), bomb[sof + 8] = char(0x60);
    auto r = d.Decode(U8(bomb), bomb.size(), all, 8, 8, /*max_pixels=*/178956970);
    REQUIRE(absl::IsResourceExhausted(r.status()));
    REQUIRE(std::string(r.status().message()).find("60000x60000") != std::string::npos);
  }
}

TEST_CASE("the train resampler: OpenCV's bilinear within two levels, SIMD and plain alike",
          "[decode]") {
  feedline::SampleRng rng(11, 0, 0, 0);
  feedline::BilinearScratch scratch;
  // Resizes `src` all three ways (SIMD, plain, NHWC), requires them to agree, returns the planes.
  auto resize = [&](const cv::Mat& src, int ow, int oh, bool flip) {
    const size_t plane = size_t(ow) * oh;
    std::vector<uint8_t> simd(3 * plane), plain(3 * plane), nhwc(3 * plane);
    REQUIRE(feedline::BilinearResize(src.data, src.cols, src.rows, src.step, ow, oh, flip,
                                     /*planar=*/true, simd.data(), &scratch));
    feedline::SetBilinearSimd(false);
    REQUIRE(feedline::BilinearResize(src.data, src.cols, src.rows, src.step, ow, oh, flip,
                                     /*planar=*/true, plain.data(), &scratch));
    feedline::SetBilinearSimd(rng.Below(2) == 1);  // NHWC: the same values, either way
    REQUIRE(feedline::BilinearResize(src.data, src.cols, src.rows, src.step, ow, oh, flip,
                                     /*planar=*/false, nhwc.data(), &scratch));
    feedline::SetBilinearSimd(true);
    REQUIRE(simd == plain);
    std::vector<uint8_t> nhwc_of_simd(3 * plane);
    for (size_t i = 0; i < plane; ++i) {
      for (int c = 0; c < 3; ++c) nhwc_of_simd[3 * i + c] = simd[c * plane + i];
    }
    REQUIRE(nhwc == nhwc_of_simd);
    return simd;
  };
  // (mean, largest) |difference| of planes `got` from the HWC image `ref`.
  auto compare = [](const std::vector<uint8_t>& got, const cv::Mat& ref) {
    const size_t plane = size_t(ref.cols) * ref.rows;
    double sum = 0;
    int most = 0;
    for (int y = 0; y < ref.rows; ++y) {
      for (int x = 0; x < ref.cols; ++x) {
        for (int c = 0; c < 3; ++c) {
          const int d = std::abs(int(got[c * plane + size_t(y) * ref.cols + x]) -
                                 int(ref.ptr<uint8_t>(y)[3 * x + c]));
          sum += d;
          most = std::max(most, d);
        }
      }
    }
    return std::make_pair(sum / double(3 * plane), most);
  };
  // A window of a wider image (stride > width), as a decoded region's crop is.
  auto image = [&](int w, int h, double blur) {
    const int pad = int(rng.Below(5));
    cv::Mat whole(h, w + pad, CV_8UC3);
    for (int y = 0; y < h; ++y) {
      for (int x = 0; x < (w + pad) * 3; ++x) whole.ptr<uint8_t>(y)[x] = uint8_t(rng.Below(256));
    }
    if (blur > 0) cv::GaussianBlur(whole, whole, cv::Size(0, 0), blur);
    return cv::Mat(whole(cv::Rect(pad, 0, w, h)));
  };

  // Bilinear range: against OpenCV's INTER_LINEAR (11-bit weights, one rounding) on noise, the
  // worst case for 7-bit weights and a rounding per pass; shrinks up to kBilinearShrinkMax and
  // enlargements down to a few pixels; mirrored output against OpenCV's, flipped.
  double worst_mean = 0;
  int worst = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int ow = 8 + int(rng.Below(300)), oh = 1 + int(rng.Below(300));
    const int sw = std::max(1, int(ow * (0.05 + 1.7 * rng.Uniform())));
    const int sh = std::max(1, int(oh * (0.05 + 1.7 * rng.Uniform())));
    const bool flip = rng.Below(2) == 1;
    INFO(sw << "x" << sh << " -> " << ow << "x" << oh << (flip ? " mirrored" : ""));
    const cv::Mat src = image(sw, sh, 0);
    const std::vector<uint8_t> got = resize(src, ow, oh, flip);
    cv::Mat ref(oh, ow, CV_8UC3);
    cv::resize(src, ref, ref.size(), 0, 0, cv::INTER_LINEAR);
    if (flip) cv::flip(ref, ref, 1);
    const auto [mean, most] = compare(got, ref);
    CHECK(most <= 2);
    CHECK(mean < 0.5);
    worst = std::max(worst, most);
    worst_mean = std::max(worst_mean, mean);
  }
  SUCCEED("against OpenCV's bilinear: worst mean |diff| " << worst_mean << ", worst pixel "
                                                          << worst);

  // Beyond kBilinearShrinkMax on an axis (up to twice it): a 2:1 box average first, then
  // bilinear. Against OpenCV's area averaging, on smooth content (blurred noise): what matters
  // is that the sample positions are right (half a pixel off shows as several levels here).
  worst_mean = 0;
  for (int trial = 0; trial < 40; ++trial) {
    const int ow = 8 + int(rng.Below(250)), oh = 1 + int(rng.Below(250));
    const bool big_x = trial % 3 != 1, big_y = trial % 3 != 0;
    auto side = [&](int out, bool big) {
      const double s = big ? feedline::kBilinearShrinkMax +
                                 rng.Uniform() * (feedline::kBilinearResizeShrinkMax - 1.76)
                           : 0.5 + rng.Uniform();
      return std::max(1, int(out * s));
    };
    const int sw = side(ow, big_x), sh = side(oh, big_y);
    const bool flip = rng.Below(2) == 1;
    INFO(sw << "x" << sh << " -> " << ow << "x" << oh << (flip ? " mirrored" : ""));
    const cv::Mat src = image(sw, sh, 3.0);
    const std::vector<uint8_t> got = resize(src, ow, oh, flip);
    cv::Mat ref(oh, ow, CV_8UC3);
    cv::resize(src, ref, ref.size(), 0, 0, cv::INTER_AREA);
    if (flip) cv::flip(ref, ref, 1);
    const double mean = compare(got, ref).first;
    CHECK(mean < 2.0);  // measured worst 1.09
    worst_mean = std::max(worst_mean, mean);
  }
  SUCCEED("2:1 box + bilinear against OpenCV's area averaging: worst mean |diff| " << worst_mean);

  // What it does not take is left to the caller, untouched.
  std::vector<uint8_t> src(800 * 800 * 3, 7), out(3 * 224 * 224, 1);
  REQUIRE_FALSE(feedline::BilinearResize(src.data(), 800, 800, 2400, 224, 224, false, true,
                                         out.data(), &scratch));  // shrink 3.57
  REQUIRE_FALSE(feedline::BilinearResize(src.data(), 10, 10, 30, 7, 7, false, false, out.data(),
                                         &scratch));  // narrower than a block
  REQUIRE(std::count(out.begin(), out.end(), 1) == long(out.size()));
}

TEST_CASE("Pillow's filter: the SIMD and plain passes give the same bytes, windows included",
          "[decode]") {
  feedline::SampleRng rng(7, 0, 0, 0);
  for (int trial = 0; trial < 60; ++trial) {
    const int sw = 1 + int(rng.Below(300)), sh = 1 + int(rng.Below(300));
    const int64_t ow = 1 + int64_t(rng.Below(400)), oh = 1 + int64_t(rng.Below(400));
    std::vector<uint8_t> src(size_t(sw) * sh * 3);
    for (auto& b : src) b = uint8_t(rng.Below(256));
    const int64_t x0 = int64_t(rng.Below(uint64_t(ow))), y0 = int64_t(rng.Below(uint64_t(oh)));
    const int w = 1 + int(rng.Below(uint64_t(ow - x0))), h = 1 + int(rng.Below(uint64_t(oh - y0)));
    std::vector<uint8_t> whole_simd(size_t(ow) * oh * 3), whole_plain(whole_simd.size());
    std::vector<uint8_t> window(size_t(w) * h * 3);
    feedline::PilScratch scratch;
    feedline::SetPilResampleSimd(true);
    feedline::PilResizeWindow(src.data(), sw, sh, size_t(sw) * 3, ow, oh, 0, 0, int(ow), int(oh),
                              whole_simd.data(), size_t(ow) * 3, &scratch);
    feedline::PilResizeWindow(src.data(), sw, sh, size_t(sw) * 3, ow, oh, x0, y0, w, h,
                              window.data(), size_t(w) * 3, &scratch);
    feedline::SetPilResampleSimd(false);
    feedline::PilResizeWindow(src.data(), sw, sh, size_t(sw) * 3, ow, oh, 0, 0, int(ow), int(oh),
                              whole_plain.data(), size_t(ow) * 3, &scratch);
    feedline::SetPilResampleSimd(true);
    INFO(sw << "x" << sh << " -> " << ow << "x" << oh << " window " << x0 << "," << y0 << " " << w
            << "x" << h);
    REQUIRE(whole_simd == whole_plain);
    // A window is the same pixels as the whole resize there (every output depends on its own
    // coordinates only), and reads only the rows PilRowsNeeded names.
    for (int r = 0; r < h; ++r) {
      REQUIRE(std::memcmp(window.data() + size_t(r) * w * 3,
                          whole_simd.data() + (size_t(y0 + r) * ow + size_t(x0)) * 3,
                          size_t(w) * 3) == 0);
    }
    REQUIRE(feedline::PilRowsNeeded(sh, oh, y0, h) <= sh);
  }
}
