// A main() for the fuzz targets in builds without libFuzzer (gcc; Release, ASan+UBSan): runs
// LLVMFuzzerTestOneInput once on each file named, or on each file inside each folder named
// (sorted), and reports how many. ctest uses it to replay tests/fuzz/regressions/ in every
// build, so a fixed crash stays fixed and the targets keep compiling without clang.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <new>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

// The largest single allocation an input may cause, as libFuzzer's -malloc_limit_mb in
// run_fuzzers.sh: the inputs are small and the decode target's pixel limit is 4 Mpixel, so an
// allocation this large means memory that the pixel limit does not bound. Sanitizer builds get
// the same bound from ASAN_OPTIONS=max_allocation_size_mb (tests/fuzz/CMakeLists.txt); their
// runtimes replace operator new themselves.
constexpr size_t kMaxAllocation = size_t{512} << 20;

#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
void* operator new(size_t n) {
  if (n > kMaxAllocation) {
    std::fprintf(stderr, "replay: allocation of %zu bytes exceeds the %zu MiB limit\n", n,
                 kMaxAllocation >> 20);
    std::abort();
  }
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
#endif

int main(int argc, char** argv) {
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    if (std::filesystem::is_directory(argv[i], ec)) {
      std::vector<std::string> in_dir;
      for (const auto& e : std::filesystem::directory_iterator(argv[i])) {
        if (e.is_regular_file() && e.path().filename().string()[0] != '.') {
          in_dir.push_back(e.path().string());
        }
      }
      std::sort(in_dir.begin(), in_dir.end());
      files.insert(files.end(), in_dir.begin(), in_dir.end());
    } else if (std::filesystem::exists(argv[i], ec)) {
      files.push_back(argv[i]);
    }  // a missing folder: nothing to replay
  }
  for (const std::string& f : files) {
    std::fprintf(stderr, "replaying %s\n", f.c_str());
    std::ifstream in(f, std::ios::binary);
    std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)),
                               std::istreambuf_iterator<char>());
    LLVMFuzzerTestOneInput(bytes.data(), bytes.size());
  }
  std::printf("replayed %zu input(s)\n", files.size());
  return 0;
}
