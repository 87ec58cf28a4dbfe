#include "synthetic_images.h"

#include <fcntl.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <numbers>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace feedline::bench {
namespace {

namespace fs = std::filesystem;

// Largest side MakePhotoLikeImage accepts: keeps w * h * 3 far from overflow and from absurd
// allocations in a helper that tests call with computed sizes.
constexpr int kMaxSide = 16384;

// The coarse colour field is computed on a grid this many pixels apart (see MakePhotoLikeImage).
constexpr int kCoarseStep = 4;

// Bumped whenever the images' content or the folder's layout changes, so that a folder made by
// an older generator is not mistaken for the current one (it is part of the marker).
constexpr int kFolderFormatVersion = 1;

// SplitMix64 (Steele, Lea, Flood 2014): tiny, fast, and the same numbers everywhere. <random>'s
// engines are portable but its distributions are not, and the data must be byte-identical on
// every machine.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [lo, hi]; the modulo bias is irrelevant at these ranges.
  int Int(int lo, int hi) {
    return lo + static_cast<int>(Next() % static_cast<uint64_t>(hi - lo + 1));
  }
  // Log-uniform in [lo, hi]: equal odds for each octave of size, as object sizes in photos.
  double LogUniform(double lo, double hi) { return lo * std::exp(std::log(hi / lo) * Uniform()); }

 private:
  uint64_t state_;
};

// A seed for the image at (a, b) of a set made from `seed`: independent streams per image, so
// that images can be made in any order, on any thread.
uint64_t MixSeed(uint64_t seed, uint64_t a, uint64_t b) {
  SplitMix64 m(seed ^ (a * 0xD6E8FEB86659FD93ULL) ^ (b * 0xA0761D6478BD642FULL));
  m.Next();
  return m.Next();
}

// One octave of 2-D value noise over a w x h image with 1 or 3 channels: random values in
// [-1, 1] on a lattice with `cell` pixels between points, interpolated with a smoothstep so
// that the result shows no grid.
class ValueNoiseOctave {
 public:
  ValueNoiseOctave(int w, int h, double cell, int channels, SplitMix64& rng)
      : channels_(channels),
        grid_w_(static_cast<int>(std::ceil(w / cell)) + 2),
        cell_(cell),
        x0_(w),
        wx_(w),
        row_(static_cast<size_t>(grid_w_) * channels) {
    const int grid_h = static_cast<int>(std::ceil(h / cell)) + 2;
    lattice_.resize(static_cast<size_t>(grid_w_) * grid_h * channels);
    for (float& v : lattice_) v = static_cast<float>(rng.Uniform(-1.0, 1.0));
    // A random sub-cell offset, so that the octaves' lattices do not line up with each other.
    const double off_x = rng.Uniform();
    off_y_ = rng.Uniform();
    for (int x = 0; x < w; ++x) {
      const double gx = x / cell + off_x;
      x0_[x] = static_cast<int>(gx);
      wx_[x] = Smooth(static_cast<float>(gx - x0_[x]));
    }
  }

  // Adds amplitude[c] * noise to dst[x * channels + c] for every x of row y.
  void AddRow(int y, float* dst, const float* amplitude) {
    const double gy = y / cell_ + off_y_;
    const int y0 = static_cast<int>(gy);
    const float fy = Smooth(static_cast<float>(gy - y0));
    // Interpolate the two lattice rows in y once (scaled by the amplitudes); then each pixel is
    // one lerp in x.
    const float* r0 = &lattice_[static_cast<size_t>(y0) * grid_w_ * channels_];
    const float* r1 = r0 + static_cast<size_t>(grid_w_) * channels_;
    for (size_t i = 0; i < row_.size(); ++i) {
      row_[i] = (r0[i] + (r1[i] - r0[i]) * fy) * amplitude[i % channels_];
    }
    if (channels_ == 3) {
      AddRowX<3>(dst);
    } else {
      AddRowX<1>(dst);
    }
  }

 private:
  static float Smooth(float t) { return t * t * (3.0f - 2.0f * t); }

  // The channel count as a constant lets the compiler unroll the inner loop: this is most of
  // the image's cost.
  template <int C>
  void AddRowX(float* dst) const {
    const int w = static_cast<int>(x0_.size());
    const float* row = row_.data();
    for (int x = 0; x < w; ++x) {
      const float* a = row + static_cast<size_t>(x0_[x]) * C;
      const float fx = wx_[x];
      for (int c = 0; c < C; ++c) dst[x * C + c] += a[c] + (a[c + C] - a[c]) * fx;
    }
  }

  int channels_;
  int grid_w_;
  double cell_;
  double off_y_ = 0;
  std::vector<int> x0_;     // per pixel column: the lattice column on its left
  std::vector<float> wx_;   // per pixel column: the smoothstep weight of the right one
  std::vector<float> row_;  // scratch: the current row, interpolated in y
  std::vector<float> lattice_;
};

// Upsamples a (lw x lh x C) grid whose point (i, j) sits at pixel (i, j) * kCoarseStep to a
// w x h image, bilinearly; lw and lh must be (w - 1) / kCoarseStep + 2 and likewise for h.
template <int C>
void UpsampleBilinear(const std::vector<float>& low, int lw, int w, int h, float* dst) {
  std::vector<float> row(static_cast<size_t>(lw) * C);
  for (int y = 0; y < h; ++y) {
    const float* r0 = &low[static_cast<size_t>(y / kCoarseStep) * lw * C];
    const float* r1 = r0 + static_cast<size_t>(lw) * C;
    const float fy = static_cast<float>(y % kCoarseStep) / kCoarseStep;
    for (size_t i = 0; i < row.size(); ++i) row[i] = r0[i] + (r1[i] - r0[i]) * fy;
    float* out = dst + static_cast<size_t>(y) * w * C;
    for (int x = 0; x < w; ++x) {
      const float* a = &row[static_cast<size_t>(x / kCoarseStep) * C];
      const float fx = static_cast<float>(x % kCoarseStep) / kCoarseStep;
      for (int c = 0; c < C; ++c) out[x * C + c] = a[c] + (a[c + C] - a[c]) * fx;
    }
  }
}

// A shape painted over the colour field: a region given by an approximate signed distance in
// pixels (negative inside), with its own colour, shading gradient and texture strength.
struct Shape {
  enum class Kind { kEllipse, kPolygon };
  Kind kind = Kind::kEllipse;
  double cx = 0, cy = 0;
  // Ellipse: semi-axes and rotation.
  double a = 1, b = 1, cos_t = 1, sin_t = 0;
  // Convex polygon: unit outward normals and offsets; inside where n . p - d <= 0 for all.
  std::vector<double> nx, ny, d;
  // Bounding box, inclusive.
  int x0 = 0, y0 = 0, x1 = -1, y1 = -1;
  float color[3] = {0, 0, 0};                          // (Y, Cb, Cr), see MakePhotoLikeImage
  float grad_x[3] = {0, 0, 0}, grad_y[3] = {0, 0, 0};  // per pixel, from the centre
  float texture = 1;                                   // scales the fine detail inside
  double edge = 1;                                     // edge width in pixels (focus blur)

  double SignedDistance(double px, double py) const {
    const double dx = px - cx, dy = py - cy;
    if (kind == Kind::kEllipse) {
      const double u = (dx * cos_t + dy * sin_t) / a;
      const double v = (-dx * sin_t + dy * cos_t) / b;
      const double r = std::sqrt(u * u + v * v);
      if (r < 1e-9) return -std::min(a, b);
      // (r - 1) / |grad r|: the distance to the boundary to first order, in pixels.
      const double gu = u / (r * a), gv = v / (r * b);
      const double gx = gu * cos_t - gv * sin_t, gy = gu * sin_t + gv * cos_t;
      return (r - 1.0) / std::max(std::sqrt(gx * gx + gy * gy), 1e-9);
    }
    double dist = -1e30;
    for (size_t i = 0; i < nx.size(); ++i) dist = std::max(dist, nx[i] * dx + ny[i] * dy - d[i]);
    return dist;
  }
};

// Amplitudes, in 8-bit brightness levels, of the per-pixel grain (before the caller's `grain`
// factor) and of each octave of fine detail. Together they set how many DCT coefficients
// survive quantisation, hence file size and decode cost; tuned so that a set made by
// MakeImageFolder averages ~100 KB per file, as ImageNet's training set does.
constexpr float kGrainLevels = 12.0f;
constexpr float kDetailLevels = 55.0f;

Shape RandomShape(int w, int h, SplitMix64& rng) {
  Shape s;
  const double size = std::max(w, h);
  s.cx = rng.Uniform(-0.1, 1.1) * w;
  s.cy = rng.Uniform(-0.1, 1.1) * h;
  const double r = rng.LogUniform(0.02 * size, 0.45 * size);
  double extent;
  const double kind = rng.Uniform();
  if (kind < 0.45) {
    s.kind = Shape::Kind::kEllipse;
    s.a = r;
    s.b = r * rng.Uniform(0.3, 1.0);
    const double t = rng.Uniform(0, std::numbers::pi);
    s.cos_t = std::cos(t);
    s.sin_t = std::sin(t);
    extent = s.a;
  } else {
    s.kind = Shape::Kind::kPolygon;
    // Thin strokes (branches, wires, window frames) or convex blobs (rocks, buildings, leaves).
    std::vector<double> vx, vy;
    if (kind < 0.6) {
      const double len = r * 2, half_width = rng.Uniform(1.0, 5.0);
      const double t = rng.Uniform(0, std::numbers::pi), c = std::cos(t), sn = std::sin(t);
      const double lx[4] = {-len, len, len, -len},
                   ly[4] = {-half_width, -half_width, half_width, half_width};
      for (int i = 0; i < 4; ++i) {
        vx.push_back(lx[i] * c - ly[i] * sn);
        vy.push_back(lx[i] * sn + ly[i] * c);
      }
    } else {
      // Vertices at increasing angles on an ellipse make a convex polygon.
      const int n = rng.Int(3, 7);
      const double squash = rng.Uniform(0.4, 1.0), rot = rng.Uniform(0, 2 * std::numbers::pi);
      std::vector<double> angles(n);
      for (double& ang : angles) ang = rng.Uniform(0, 2 * std::numbers::pi);
      std::sort(angles.begin(), angles.end());
      for (double ang : angles) {
        const double ex = r * std::cos(ang), ey = r * squash * std::sin(ang);
        vx.push_back(ex * std::cos(rot) - ey * std::sin(rot));
        vy.push_back(ex * std::sin(rot) + ey * std::cos(rot));
      }
    }
    extent = 0;
    const size_t n = vx.size();
    for (size_t i = 0; i < n; ++i) {
      const size_t j = (i + 1) % n;
      double ex = vx[j] - vx[i], ey = vy[j] - vy[i];
      const double len = std::hypot(ex, ey);
      if (len < 1e-9) continue;
      // Counter-clockwise vertices: the outward normal is the edge turned clockwise.
      const double onx = ey / len, ony = -ex / len;
      s.nx.push_back(onx);
      s.ny.push_back(ony);
      s.d.push_back(onx * vx[i] + ony * vy[i]);
      extent = std::max(extent, std::hypot(vx[i], vy[i]));
    }
    if (s.nx.size() < 3) {  // degenerate: fall back to a small disc
      s.kind = Shape::Kind::kEllipse;
      s.a = s.b = std::max(r, 2.0);
      extent = s.a;
    }
  }
  s.edge = rng.Uniform(0.6, 2.5);
  const double pad = extent + 2 * s.edge + 1;
  s.x0 = std::max(0, static_cast<int>(std::floor(s.cx - pad)));
  s.y0 = std::max(0, static_cast<int>(std::floor(s.cy - pad)));
  s.x1 = std::min(w - 1, static_cast<int>(std::ceil(s.cx + pad)));
  s.y1 = std::min(h - 1, static_cast<int>(std::ceil(s.cy + pad)));
  // Object colours, in (Y, Cb, Cr): any brightness, usually a muted hue, sometimes a vivid one.
  s.color[0] = static_cast<float>(rng.Uniform(15, 240));
  const double chroma = rng.Uniform() < 0.2 ? 50 : 25;
  s.color[1] = static_cast<float>(rng.Uniform(-chroma, chroma));
  s.color[2] = static_cast<float>(rng.Uniform(-chroma, chroma));
  // Shading: up to ~80 levels of brightness across the shape, as light on a curved surface;
  // a little in the hue too.
  const double gdir = rng.Uniform(0, 2 * std::numbers::pi);
  for (int c = 0; c < 3; ++c) {
    const double g = rng.Uniform(-40, 40) * (c == 0 ? 1.0 : 0.25) / std::max(extent, 1.0);
    s.grad_x[c] = static_cast<float>(g * std::cos(gdir));
    s.grad_y[c] = static_cast<float>(g * std::sin(gdir));
  }
  // Smooth objects (sky, walls, skin) next to textured ones (grass, fur, foliage).
  s.texture = static_cast<float>(rng.LogUniform(0.15, 2.0));
  return s;
}

void PaintShape(const Shape& s, int w, float* color, float* texture) {
  const double inv_edge = 1.0 / s.edge;
  // The distance is 1-Lipschitz for polygons (exact inside, a lower bound outside) and close to
  // it for ellipses, so a pixel at distance |d| from the boundary has neighbours that are still
  // on its side for about |d| pixels: skip (outside) or fill (inside) them without evaluating
  // the distance again. This makes painting cost ~ the perimeter instead of the area.
  const double lipschitz = s.kind == Shape::Kind::kPolygon ? 1.0 : 0.5;
  const double margin = 0.5 * s.edge + 1.0;
  for (int y = s.y0; y <= s.y1; ++y) {
    const float dy = static_cast<float>(y - s.cy);
    float row_color[3];  // the shape's colour at x = cx on this row
    for (int c = 0; c < 3; ++c) row_color[c] = s.color[c] + s.grad_y[c] * dy;
    float* crow = color + static_cast<size_t>(y) * w * 3;
    float* trow = texture + static_cast<size_t>(y) * w;
    for (int x = s.x0; x <= s.x1;) {
      const double dist = s.SignedDistance(x + 0.5, y + 0.5);
      const int run = std::max(1, static_cast<int>((std::abs(dist) - margin) * lipschitz));
      if (dist > margin) {  // outside, and so are the next `run` pixels
        x += run;
        continue;
      }
      if (dist < -margin) {  // inside, and so are the next `run` pixels: plain stores
        const int end = std::min(s.x1 + 1, x + run);
        for (; x < end; ++x) {
          const float dx = static_cast<float>(x - s.cx);
          for (int c = 0; c < 3; ++c) crow[x * 3 + c] = row_color[c] + s.grad_x[c] * dx;
          trow[x] = s.texture;
        }
        continue;
      }
      // On the edge: blend by coverage.
      const float alpha = static_cast<float>(std::clamp(0.5 - dist * inv_edge, 0.0, 1.0));
      const float dx = static_cast<float>(x - s.cx);
      for (int c = 0; c < 3; ++c) {
        const float target = row_color[c] + s.grad_x[c] * dx;
        crow[x * 3 + c] += (target - crow[x * 3 + c]) * alpha;
      }
      trow[x] += (s.texture - trow[x]) * alpha;
      ++x;
    }
  }
}

// Maps an errno-style error of the file system to a status naming the path.
absl::Status FsError(const std::error_code& ec, const std::string& what, const fs::path& path) {
  return absl::ErrnoToStatus(ec.value(), absl::StrCat(what, " ", path.string()));
}

absl::Status WriteFile(const fs::path& path, const std::string& bytes) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat("cannot create ", path.string()));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat("cannot write ", path.string()));
    }
    done += static_cast<size_t>(n);
  }
  if (::close(fd) != 0) {
    return absl::ErrnoToStatus(errno, absl::StrCat("cannot write ", path.string()));
  }
  return absl::OkStatus();
}

// Reads a whole (small) file; false when it cannot be read.
bool ReadSmallFile(const fs::path& path, std::string* out) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return !in.bad();
}

int Digits(int64_t n) {
  int d = 1;
  while (n >= 10) {
    n /= 10;
    ++d;
  }
  return d;
}

std::string ZeroPadded(int64_t n, int width) {
  std::string s = absl::StrCat(n);
  if (static_cast<int>(s.size()) < width) s.insert(0, width - s.size(), '0');
  return s;
}

// The parameters of one image of a folder, drawn from its own seed.
struct ImageSpec {
  int w = 500, h = 375, quality = 90;
  bool subsample444 = false;
  uint64_t pixel_seed = 0;
};

ImageSpec DrawImageSpec(uint64_t image_seed) {
  SplitMix64 rng(image_seed);
  ImageSpec spec;
  // ImageNet's training images were mostly scaled to 500 pixels on the long side by Flickr;
  // the rest spread widely. Aspect ratios: 4:3 cameras, 3:2 SLRs, some squares and crops.
  const int long_side = rng.Uniform() < 0.65 ? 500 : rng.Int(320, 700);
  const double pick = rng.Uniform();
  const double aspect = pick < 0.45   ? 4.0 / 3.0
                        : pick < 0.7  ? 3.0 / 2.0
                        : pick < 0.77 ? 1.0
                                      : rng.Uniform(1.1, 1.9);
  const int short_side = std::max(1, static_cast<int>(std::lround(long_side / aspect)));
  const bool portrait = rng.Uniform() < 0.2;
  spec.w = portrait ? short_side : long_side;
  spec.h = portrait ? long_side : short_side;
  spec.quality = rng.Int(85, 95);
  spec.subsample444 = rng.Uniform() < 0.15;
  spec.pixel_seed = rng.Next();
  return spec;
}

std::string MarkerText(int num_classes, int per_class, uint64_t seed) {
  return absl::StrCat("feedline synthetic ImageFolder\nformat=", kFolderFormatVersion,
                      "\nnum_classes=", num_classes, "\nper_class=", per_class, "\nseed=", seed,
                      "\n");
}

constexpr char kMarkerName[] = ".complete";

// What `dir` holds now, relative to the folder that was asked for.
enum class DirState { kMissingOrEmpty, kSameFolder, kOther };

absl::StatusOr<DirState> InspectDir(const fs::path& dir, const std::string& marker) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return FsError(ec, "cannot stat", dir);
  if (!fs::exists(st)) return DirState::kMissingOrEmpty;
  if (!fs::is_directory(st)) return DirState::kOther;
  std::string existing;
  if (ReadSmallFile(dir / kMarkerName, &existing)) {
    return existing == marker ? DirState::kSameFolder : DirState::kOther;
  }
  const bool empty = fs::is_empty(dir, ec);
  if (ec) return FsError(ec, "cannot read", dir);
  return empty ? DirState::kMissingOrEmpty : DirState::kOther;
}

absl::Status AlreadyThere(const fs::path& dir) {
  return absl::FailedPreconditionError(
      absl::StrCat(dir.string(),
                   " exists and is not a synthetic image folder made with these parameters; "
                   "remove it or choose another directory"));
}

}  // namespace

absl::StatusOr<std::string> EncodeJpeg(const uint8_t* rgb, int w, int h, int quality,
                                       bool subsample444, bool progressive, bool grayscale) {
  if (rgb == nullptr) return absl::InvalidArgumentError("EncodeJpeg: null pixels");
  if (w < 1 || h < 1 || w > 65500 || h > 65500) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeJpeg: bad size ", w, "x", h));
  }
  if (quality < 1 || quality > 100) {
    return absl::InvalidArgumentError(absl::StrCat("EncodeJpeg: quality ", quality, " not 1..100"));
  }
  // One handle per call: handles are not thread-safe, and creating one costs microseconds
  // against the milliseconds of the compression itself.
  std::unique_ptr<void, int (*)(tjhandle)> handle(tjInitCompress(), &tjDestroy);
  if (handle == nullptr) {
    return absl::InternalError(absl::StrCat("tjInitCompress: ", tjGetErrorStr2(nullptr)));
  }
  const int subsamp = grayscale ? TJSAMP_GRAY : subsample444 ? TJSAMP_444 : TJSAMP_420;
  const int flags = (progressive ? TJFLAG_PROGRESSIVE : 0) | TJFLAG_NOREALLOC;
  // tjBufSize is a worst case for any content, so NOREALLOC cannot fail for lack of room.
  const unsigned long capacity = tjBufSize(w, h, subsamp);
  if (capacity == static_cast<unsigned long>(-1)) {
    return absl::InternalError(absl::StrCat("tjBufSize: ", tjGetErrorStr2(handle.get())));
  }
  std::unique_ptr<unsigned char, void (*)(unsigned char*)> buf(tjAlloc(static_cast<int>(capacity)),
                                                               &tjFree);
  if (buf == nullptr) return absl::ResourceExhaustedError("EncodeJpeg: out of memory");
  unsigned char* out = buf.get();
  unsigned long size = capacity;
  if (tjCompress2(handle.get(), rgb, w, /*pitch=*/0, h, TJPF_RGB, &out, &size, subsamp, quality,
                  flags) != 0) {
    return absl::InternalError(absl::StrCat("tjCompress2: ", tjGetErrorStr2(handle.get())));
  }
  return std::string(reinterpret_cast<const char*>(out), size);
}

std::vector<uint8_t> MakePhotoLikeImage(int w, int h, uint64_t seed, double grain) {
  if (w < 1 || h < 1 || w > kMaxSide || h > kMaxSide) return {};
  SplitMix64 rng(MixSeed(seed, 0x5EED, 1));
  const size_t n = static_cast<size_t>(w) * h;
  // The image is built in (Y, Cb, Cr), JPEG's own colour space: photographs put their fine
  // detail in brightness and keep colour smooth and muted, and that is easy to say in YCbCr.
  std::vector<float> ycc(n * 3);
  std::vector<float> texture(n);
  const double size = std::max(w, h);

  // 1. The colour field: a scene tint plus coarse octaves (sky and ground, light and shadow),
  //    and the texture strength of the background, which varies smoothly (in focus here,
  //    blurred there). Their finest cells are >= 30 px, so they are computed on a grid 4x
  //    coarser and upsampled bilinearly: the same look at a fraction of the cost.
  const int lw = (w - 1) / kCoarseStep + 2, lh = (h - 1) / kCoarseStep + 2;
  const float mean[3] = {static_cast<float>(rng.Uniform(60, 190)),
                         static_cast<float>(rng.Uniform(-25, 25)),
                         static_cast<float>(rng.Uniform(-25, 25))};
  std::vector<ValueNoiseOctave> color_octaves;
  std::vector<std::array<float, 3>> color_amp;
  for (double cell = size / 1.5, amp = 1; cell >= size / 10; cell /= 2, amp *= 0.6) {
    color_octaves.emplace_back(lw, lh, cell / kCoarseStep, 3, rng);
    color_amp.push_back(
        {static_cast<float>(50 * amp), static_cast<float>(22 * amp), static_cast<float>(22 * amp)});
  }
  ValueNoiseOctave texture_octave(lw, lh, size / 3 / kCoarseStep, 1, rng);
  const float texture_base = static_cast<float>(rng.Uniform(0.5, 1.2));
  const float texture_amp = 0.5f * texture_base;
  std::vector<float> coarse_color(static_cast<size_t>(lw) * lh * 3);
  std::vector<float> coarse_texture(static_cast<size_t>(lw) * lh, texture_base);
  for (int y = 0; y < lh; ++y) {
    float* row = &coarse_color[static_cast<size_t>(y) * lw * 3];
    for (int x = 0; x < lw; ++x) {
      for (int c = 0; c < 3; ++c) row[x * 3 + c] = mean[c];
    }
    for (size_t o = 0; o < color_octaves.size(); ++o) {
      color_octaves[o].AddRow(y, row, color_amp[o].data());
    }
    texture_octave.AddRow(y, &coarse_texture[static_cast<size_t>(y) * lw], &texture_amp);
  }
  UpsampleBilinear<3>(coarse_color, lw, w, h, ycc.data());
  UpsampleBilinear<1>(coarse_texture, lw, w, h, texture.data());

  // 2. Objects: shapes with edges, their own shading and their own texture strength.
  const int num_shapes = rng.Int(6, 28);
  for (int i = 0; i < num_shapes; ++i) {
    PaintShape(RandomShape(w, h, rng), w, ycc.data(), texture.data());
  }

  // 3. Fine detail in brightness, scaled by the local texture strength: octaves from 24 px
  //    structure down to 1.5 px, of equal amplitude (the 1/f spectrum of natural images).
  std::vector<ValueNoiseOctave> detail_octaves;
  for (double cell = 24; cell >= 1.4; cell /= 2) detail_octaves.emplace_back(w, h, cell, 1, rng);
  std::vector<float> detail(w);
  std::vector<uint8_t> out(n * 3);
  // 4. Grain: sensor noise, mostly in brightness. Two uniform bytes summed give a triangular
  //    distribution, close enough to a Gaussian at a fraction of the cost.
  SplitMix64 grain_rng(rng.Next());
  const float grain_y = static_cast<float>(kGrainLevels * grain / 255.0);
  const float grain_c = static_cast<float>(0.3 * kGrainLevels * grain / 128.0);
  for (int y = 0; y < h; ++y) {
    std::fill(detail.begin(), detail.end(), 0.0f);
    for (size_t o = 0; o < detail_octaves.size(); ++o) {
      detail_octaves[o].AddRow(y, detail.data(), &kDetailLevels);
    }
    const float* crow = &ycc[static_cast<size_t>(y) * w * 3];
    const float* trow = &texture[static_cast<size_t>(y) * w];
    uint8_t* orow = &out[static_cast<size_t>(y) * w * 3];
    for (int x = 0; x < w; ++x) {
      const uint64_t r = grain_rng.Next();
      const int g0 = static_cast<int>(r & 0xFF), g1 = static_cast<int>((r >> 8) & 0xFF);
      const int g2 = static_cast<int>((r >> 16) & 0xFF), g3 = static_cast<int>((r >> 24) & 0xFF);
      // Grain follows the texture strength too: fine texture (foliage, fur, gravel) is where
      // photographs spend most of their bits, while a clear sky carries only sensor noise.
      const float yy = crow[x * 3] +
                       trow[x] * (detail[x] + static_cast<float>(g0 + g1 - 255) * grain_y) +
                       static_cast<float>(g0 - g1) * grain_y * 0.25f;
      const float cb = crow[x * 3 + 1] + static_cast<float>(g2 - 128) * grain_c;
      const float cr = crow[x * 3 + 2] + static_cast<float>(g3 - 128) * grain_c;
      // JFIF's YCbCr -> RGB.
      const float rgb[3] = {yy + 1.402f * cr, yy - 0.344136f * cb - 0.714136f * cr,
                            yy + 1.772f * cb};
      for (int c = 0; c < 3; ++c) {
        orow[x * 3 + c] = static_cast<uint8_t>(std::clamp(rgb[c] + 0.5f, 0.0f, 255.0f));
      }
    }
  }
  return out;
}

absl::Status MakeImageFolder(const std::string& dir, int num_classes, int per_class, uint64_t seed,
                             const ProgressFn& progress) {
  // Limits that keep the file names and the total well within reason for a benchmark set.
  if (num_classes < 1 || num_classes > 100000) {
    return absl::InvalidArgumentError(absl::StrCat("num_classes must be 1..100000: ", num_classes));
  }
  if (per_class < 1 || per_class > 10000000) {
    return absl::InvalidArgumentError(absl::StrCat("per_class must be 1..1e7: ", per_class));
  }
  if (dir.empty()) return absl::InvalidArgumentError("MakeImageFolder: empty directory name");
  const fs::path target = fs::path(dir).lexically_normal();
  const fs::path final_dir = target.has_filename() ? target : target.parent_path();
  const std::string marker = MarkerText(num_classes, per_class, seed);
  const int64_t total = int64_t{num_classes} * per_class;

  absl::StatusOr<DirState> state = InspectDir(final_dir, marker);
  if (!state.ok()) return state.status();
  if (*state == DirState::kSameFolder) {
    if (progress) progress(total, total);
    return absl::OkStatus();
  }
  if (*state == DirState::kOther) return AlreadyThere(final_dir);

  std::error_code ec;
  fs::path parent = final_dir.parent_path();
  if (parent.empty()) parent = ".";
  fs::create_directories(parent, ec);
  if (ec) return FsError(ec, "cannot create", parent);
  // A sibling of the target, so that the final rename stays within one file system. The pid
  // keeps processes apart and a counter keeps threads apart; a clock-derived part avoids
  // reusing the name of a copy that a killed process left behind. create_directory reports an
  // existing directory as `false`, which must not be taken for our own.
  static std::atomic<uint64_t> attempt{0};
  const uint64_t nonce = MixSeed(
      attempt.fetch_add(1, std::memory_order_relaxed),
      static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()), seed);
  const fs::path tmp = parent / absl::StrCat(".", final_dir.filename().string(), ".tmp-",
                                             ::getpid(), "-", absl::Hex(nonce));
  if (!fs::create_directory(tmp, ec)) {
    if (!ec) ec = std::make_error_code(std::errc::file_exists);
    return FsError(ec, "cannot create", tmp);
  }
  // Removes the temporary directory on every early return.
  struct TmpGuard {
    fs::path path;
    ~TmpGuard() {
      if (!path.empty()) {
        std::error_code ignored;
        fs::remove_all(path, ignored);
      }
    }
  } guard{tmp};

  const int class_digits = std::max(2, Digits(num_classes - 1));
  const int image_digits = std::max(5, Digits(per_class - 1));
  std::vector<fs::path> class_dirs;
  for (int c = 0; c < num_classes; ++c) {
    class_dirs.push_back(tmp / absl::StrCat("class_", ZeroPadded(c, class_digits)));
    fs::create_directory(class_dirs.back(), ec);
    if (ec) return FsError(ec, "cannot create", class_dirs.back());
  }

  // Workers take images from a shared counter; the calling thread reports progress.
  std::atomic<int64_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  int64_t done = 0;          // guarded by mu
  absl::Status first_error;  // guarded by mu
  std::atomic<bool> failed{false};
  auto work = [&] {
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= total) break;
      const int c = static_cast<int>(i / per_class);
      const int k = static_cast<int>(i % per_class);
      const ImageSpec spec =
          DrawImageSpec(MixSeed(seed, static_cast<uint64_t>(c), static_cast<uint64_t>(k)));
      const std::vector<uint8_t> rgb = MakePhotoLikeImage(spec.w, spec.h, spec.pixel_seed);
      absl::StatusOr<std::string> jpeg =
          EncodeJpeg(rgb.data(), spec.w, spec.h, spec.quality, spec.subsample444);
      absl::Status s = jpeg.status();
      if (s.ok()) {
        s = WriteFile(class_dirs[c] / absl::StrCat("img_", ZeroPadded(k, image_digits), ".JPEG"),
                      *jpeg);
      }
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok() && first_error.ok()) {
        first_error = std::move(s);
        failed.store(true, std::memory_order_relaxed);
      }
      ++done;
      cv.notify_one();
    }
  };
  const int num_threads = static_cast<int>(
      std::clamp<int64_t>(std::thread::hardware_concurrency(), 1, std::min<int64_t>(total, 64)));
  std::vector<std::thread> threads;
  for (int t = 0; t < num_threads; ++t) threads.emplace_back(work);
  {
    std::unique_lock<std::mutex> lock(mu);
    int64_t reported = -1;
    // Wakes for each finished image; stops when all are done or one failed (the others then
    // stop claiming new images, and the joins below wait for the ones in progress).
    while (true) {
      cv.wait(lock, [&] { return done != reported || !first_error.ok(); });
      if (!first_error.ok() || done == total) break;
      reported = done;
      if (progress) {
        lock.unlock();
        progress(reported, total);
        lock.lock();
      }
    }
  }
  for (std::thread& t : threads) t.join();
  if (!first_error.ok()) return first_error;

  absl::Status s = WriteFile(tmp / kMarkerName, marker);
  if (!s.ok()) return s;
  fs::rename(tmp, final_dir, ec);
  if (ec) {
    // Someone else may have finished the same folder first; theirs is as good as ours.
    absl::StatusOr<DirState> now = InspectDir(final_dir, marker);
    if (now.ok() && *now == DirState::kSameFolder) {
      if (progress) progress(total, total);
      return absl::OkStatus();
    }
    return FsError(ec, absl::StrCat("cannot rename ", tmp.string(), " to"), final_dir);
  }
  guard.path.clear();
  if (progress) progress(total, total);
  return absl::OkStatus();
}

}  // namespace feedline::bench
