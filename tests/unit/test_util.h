// Test helpers: temporary folders and real JPEG files.
#ifndef FEEDLINE_TESTS_UNIT_TEST_UTIL_H_
#define FEEDLINE_TESTS_UNIT_TEST_UTIL_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "feedline/files.h"
#include "feedline/loader.h"

namespace feedline::testing {

// A fresh directory under $TMPDIR, removed (recursively) on destruction.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

void WriteFile(const std::string& path, const std::string& bytes);
std::string ReadFile(const std::string& path);
void MakeDirs(const std::string& path);

// A photo-like JPEG of w x h.
std::string PhotoJpeg(int w, int h, uint64_t seed, int quality = 90, bool s444 = false,
                      bool progressive = false, bool gray = false);

// An ImageFolder with `classes` classes of `per_class` small JPEGs each (sizes 48..160 px so
// that tests run fast). Returns the number of images.
int MakeSmallImageFolder(const std::string& dir, int classes, int per_class, uint64_t seed);

// A ustar archive of `members` (name, bytes), as WebDataset shards are written.
std::string Tar(const std::vector<std::pair<std::string, std::string>>& members);

// Peak signal-to-noise ratio of two equally sized uint8 buffers, in dB.
double Psnr(const uint8_t* a, const uint8_t* b, size_t n);

// The file list of an image loader (its data set is a FileDataset).
inline const FileList& Files(const Loader& loader) {
  return dynamic_cast<const FileDataset&>(loader.dataset()).files();
}

}  // namespace feedline::testing

#endif  // FEEDLINE_TESTS_UNIT_TEST_UTIL_H_
