#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "synthetic_images.h"

namespace feedline::testing {

TempDir::TempDir() {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base ? base : "/tmp") + "/feedline-test-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                               std::filesystem::perm_options::add, ec);
  std::filesystem::remove_all(path_, ec);
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void MakeDirs(const std::string& path) { std::filesystem::create_directories(path); }

std::string PhotoJpeg(int w, int h, uint64_t seed, int quality, bool s444, bool progressive,
                      bool gray) {
  std::vector<uint8_t> rgb = bench::MakePhotoLikeImage(w, h, seed);
  auto jpeg = bench::EncodeJpeg(rgb.data(), w, h, quality, s444, progressive, gray);
  if (!jpeg.ok()) throw std::runtime_error(std::string(jpeg.status().message()));
  return *jpeg;
}

int MakeSmallImageFolder(const std::string& dir, int classes, int per_class, uint64_t seed) {
  int n = 0;
  for (int c = 0; c < classes; ++c) {
    std::string cdir = dir + "/class" + std::to_string(c);
    MakeDirs(cdir);
    for (int i = 0; i < per_class; ++i) {
      const uint64_t s = seed * 1000003 + uint64_t(c) * 1000 + uint64_t(i);
      const int w = 48 + int(s * 7919 % 113), h = 48 + int(s * 104729 % 97);
      char name[32];
      std::snprintf(name, sizeof(name), "/img%03d.jpg", i);
      WriteFile(cdir + name, PhotoJpeg(w, h, s, 85, i % 5 == 0));
      ++n;
    }
  }
  return n;
}

double Psnr(const uint8_t* a, const uint8_t* b, size_t n) {
  double se = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = double(a[i]) - double(b[i]);
    se += d * d;
  }
  if (se == 0) return 99.0;
  return 10.0 * std::log10(255.0 * 255.0 / (se / double(n)));
}

}  // namespace feedline::testing
