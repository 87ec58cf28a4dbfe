// feedline — counter-based randomness: every random choice about a sample is a pure function of
// (seed, epoch, sample index, purpose), never of thread timing, so the same seed gives the same
// bytes whatever the worker count, and a resumed run continues exactly.
#ifndef FEEDLINE_RANDOM_H_
#define FEEDLINE_RANDOM_H_

#include <cstdint>

namespace feedline {

// SplitMix64's finaliser: a bijective 64-bit mixer with good avalanche.
constexpr uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// A small stream generator (SplitMix64) keyed by a tuple of integers.
class SampleRng {
 public:
  SampleRng(uint64_t seed, uint64_t epoch, uint64_t index, uint64_t purpose)
      : state_(Mix64(Mix64(Mix64(Mix64(seed) ^ epoch) ^ index) ^ purpose)) {}
  uint64_t Next() { return Mix64(state_ += 0x9E3779B97F4A7C15ULL); }
  // Uniform in [0, 1) with 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  double Uniform(double lo, double hi) { return lo + (hi - lo) * Uniform(); }
  // Uniform integer in [0, n), n >= 1 (Lemire's multiply-shift with rejection: unbiased).
  uint64_t Below(uint64_t n) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * n;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < n) {
      const uint64_t threshold = -n % n;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * n;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }

 private:
  uint64_t state_;
};

// Purposes (one stream per kind of choice). Streams below kRngUserBase are the library's own;
// SampleContext::rng(stream) gives user transforms kRngUserBase + stream.
inline constexpr uint64_t kRngShuffle = 1;
inline constexpr uint64_t kRngCrop = 2;
inline constexpr uint64_t kRngFlip = 3;
inline constexpr uint64_t kRngReplace = 4;
inline constexpr uint64_t kRngMix = 5;  // a mixture's per-source record orders (mix.h)
inline constexpr uint64_t kRngClip = 6;  // a video clip's start (video.h)
inline constexpr uint64_t kRngUserBase = uint64_t{1} << 32;

}  // namespace feedline

#endif  // FEEDLINE_RANDOM_H_
