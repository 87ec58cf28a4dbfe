#include "test_util.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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

std::string Tar(const std::vector<std::pair<std::string, std::string>>& members) {
  std::string out;
  for (const auto& [name, data] : members) {
    char h[512] = {};
    std::snprintf(h, 100, "%s", name.c_str());
    std::snprintf(h + 100, 8, "%07o", 0644);
    std::snprintf(h + 108, 8, "%07o", 0);
    std::snprintf(h + 116, 8, "%07o", 0);
    std::snprintf(h + 124, 12, "%011lo", static_cast<unsigned long>(data.size()));
    std::snprintf(h + 136, 12, "%011o", 0);
    h[156] = '0';
    std::memcpy(h + 257, "ustar", 6);
    std::memcpy(h + 263, "00", 2);
    std::memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (unsigned char c : h) sum += c;
    std::snprintf(h + 148, 8, "%06o", sum);
    out.append(h, 512);
    out += data;
    out.append((512 - data.size() % 512) % 512, '\0');
  }
  out.append(1024, '\0');
  return out;
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
