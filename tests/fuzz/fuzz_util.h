// Helpers shared by the fuzz targets: input-derived parameters and a checked abort.
#ifndef FEEDLINE_TESTS_FUZZ_FUZZ_UTIL_H_
#define FEEDLINE_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace feedline::fuzz {

// A property the code under test promises failed: print it and abort, so that libFuzzer (or
// the replay driver) reports the input as a crash.
[[noreturn]] inline void Fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "fuzz check failed: %s %s\n", what, detail.c_str());
  std::abort();
}
#define FUZZ_CHECK(cond, detail)                          \
  do {                                                    \
    if (!(cond)) ::feedline::fuzz::Fail(#cond, (detail)); \
  } while (0)

// Parameters that must not consume the input's bytes (the seeds have to stay valid images,
// archives, ...) come from a hash of the whole input: deterministic for a given input, and
// changed by any mutation.
class InputHash {
 public:
  InputHash(const uint8_t* data, size_t size) {
    uint64_t h = 1469598103934665603ULL;  // FNV-1a
    for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 1099511628211ULL;
    state_ = h;
  }
  uint64_t Next() {  // SplitMix64
    uint64_t x = (state_ += 0x9E3779B97F4A7C15ULL);
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
    return x ^ (x >> 31);
  }
  // In [lo, hi].
  int Range(int lo, int hi) { return lo + int(Next() % uint64_t(hi - lo + 1)); }
  bool Bit() { return Next() & 1; }

 private:
  uint64_t state_;
};

// An anonymous in-memory file holding `data`, reachable by path as /proc/self/fd/N: the
// file-based entry points (IndexTar, TarDataset, ScanFileList) are checked against the
// buffer-based ones on the same bytes. One per process, rewritten per input.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("feedline-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) Fail("memfd_create");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  const std::string& Write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) Fail("ftruncate");
    size_t done = 0;
    while (done < size) {
      ssize_t n = pwrite(fd_, data + done, size - done, off_t(done));
      if (n <= 0) Fail("pwrite");
      done += size_t(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace feedline::fuzz

#endif  // FEEDLINE_TESTS_FUZZ_FUZZ_UTIL_H_
