#include "baselines.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <time.h>
#include <turbojpeg.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "bench_util.h"
#include "synthetic_images.h"

namespace feedline::bench {
namespace {

namespace fs = std::filesystem;

double ThreadCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}

absl::Status ReadFile(const std::string& path, std::string* out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return absl::ErrnoToStatus(errno, absl::StrCat(path, ": open"));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return absl::ErrnoToStatus(err, absl::StrCat(path, ": stat"));
  }
  out->resize(size_t(st.st_size));
  size_t done = 0;
  while (done < out->size()) {
    const ssize_t n = ::pread(fd, out->data() + done, out->size() - done, off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      ::close(fd);
      return absl::ErrnoToStatus(err, absl::StrCat(path, ": read"));
    }
    done += size_t(n);
  }
  ::close(fd);
  return absl::OkStatus();
}

struct TjDeleter {
  void operator()(void* h) const { tjDestroy(h); }
};
using TjHandle = std::unique_ptr<void, TjDeleter>;

// A full decode to packed RGB (at `eighths`/8 of the size); returns the pixel count.
absl::StatusOr<int64_t> DecodeFull(tjhandle tj, const std::string& jpeg, const std::string& name,
                                   std::vector<uint8_t>* rgb, int eighths = 8) {
  int w = 0, h = 0, subsamp = 0, colorspace = 0;
  const auto* data = reinterpret_cast<const unsigned char*>(jpeg.data());
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(jpeg.size()), &w, &h, &subsamp,
                          &colorspace) != 0) {
    return absl::DataLossError(absl::StrCat(name, ": ", tjGetErrorStr2(tj)));
  }
  if (eighths != 8) {
    const tjscalingfactor f{eighths, 8};
    w = TJSCALED(w, f);
    h = TJSCALED(h, f);
  }
  rgb->resize(size_t(w) * size_t(h) * 3);
  if (tjDecompress2(tj, data, static_cast<unsigned long>(jpeg.size()), rgb->data(), w, 0, h,
                    TJPF_RGB, 0) != 0 &&
      tjGetErrorCode(tj) == TJERR_FATAL) {
    return absl::DataLossError(absl::StrCat(name, ": ", tjGetErrorStr2(tj)));
  }
  return int64_t{w} * h;
}

// Reads `files` into memory, then `threads` threads at once each decode a few of them untimed
// (warm-up: the decoder's tables, the output buffer, the caches) and then every file once,
// timed together (each starting at its own place in the list: not all on the same file).
absl::StatusOr<DecodeLimit> TimeDecodes(const std::vector<std::string>& files, int cores,
                                        int threads, int eighths) {
  if (files.empty()) return absl::InvalidArgumentError("decode limit: no files");
  std::vector<std::string> data(files.size());
  DecodeLimit limit;
  limit.cores = cores;
  limit.threads = std::max(threads, 1);
  for (size_t i = 0; i < files.size(); ++i) {
    if (absl::Status s = ReadFile(files[i], &data[i]); !s.ok()) return s;
    limit.bytes += int64_t(data[i].size());
  }
  const int n = limit.threads;
  std::vector<absl::Status> status(size_t(n), absl::OkStatus());
  std::vector<double> cpu(size_t(n), 0.0);
  std::vector<int64_t> pixels(size_t(n), 0);
  std::mutex mu;
  std::condition_variable cv;
  int warm = 0;  // threads done warming up; the timed loops start together
  Clock::time_point start;
  std::vector<std::thread> pool;
  for (int t = 0; t < n; ++t) {
    pool.emplace_back([&, t] {
      TjHandle tj(tjInitDecompress());
      std::vector<uint8_t> rgb;
      absl::Status st =
          tj == nullptr ? absl::InternalError("tjInitDecompress failed") : absl::OkStatus();
      for (size_t i = 0; st.ok() && i < std::min<size_t>(files.size(), 16); ++i) {
        st = DecodeFull(tj.get(), data[i], files[i], &rgb, eighths).status();
      }
      {
        std::unique_lock<std::mutex> lock(mu);
        if (++warm == n) {
          start = Clock::now();
          cv.notify_all();
        }
        cv.wait(lock, [&] { return warm == n; });
      }
      const double c0 = ThreadCpuSeconds();
      for (size_t k = 0; st.ok() && k < files.size(); ++k) {
        const size_t i = (k + size_t(t) * files.size() / size_t(n)) % files.size();
        absl::StatusOr<int64_t> px = DecodeFull(tj.get(), data[i], files[i], &rgb, eighths);
        if (px.ok()) {
          pixels[size_t(t)] += *px;
        } else {
          st = px.status();
        }
      }
      cpu[size_t(t)] = ThreadCpuSeconds() - c0;
      status[size_t(t)] = st;
    });
  }
  for (std::thread& t : pool) t.join();
  limit.seconds = SecondsSince(start);
  for (int t = 0; t < n; ++t) {
    if (!status[size_t(t)].ok()) return status[size_t(t)];
    limit.thread_cpu_seconds += cpu[size_t(t)];
    limit.megapixels += double(pixels[size_t(t)]) * 1e-6;
  }
  limit.images = int64_t(files.size()) * n;
  return limit;
}

}  // namespace

absl::StatusOr<int64_t> WarmPageCache(const std::vector<std::string>& files) {
  std::string buffer;
  int64_t bytes = 0;
  for (const std::string& f : files) {
    if (absl::Status s = ReadFile(f, &buffer); !s.ok()) return s;
    bytes += int64_t(buffer.size());
  }
  return bytes;
}

absl::StatusOr<DecodeLimit> MeasureDecodeLimit(const std::vector<std::string>& files, int cores,
                                               int eighths) {
  return TimeDecodes(files, cores, /*threads=*/1, eighths);
}

absl::StatusOr<DecodeLimit> MeasureDecodeAllCores(const std::vector<std::string>& files, int cores,
                                                  int eighths) {
  return TimeDecodes(files, cores, /*threads=*/cores, eighths);
}

absl::StatusOr<std::string> EnsureTinyDataset(const std::string& dir, int distinct,
                                              int64_t samples) {
  const fs::path root(dir);
  const fs::path list = root / "list.txt";
  const std::string marker_text = absl::StrCat("tiny 8x8 jpeg: ", distinct, " ", samples, "\n");
  std::error_code ec;
  {
    std::ifstream marker(root / ".complete");
    std::string text((std::istreambuf_iterator<char>(marker)), std::istreambuf_iterator<char>());
    if (text == marker_text && fs::exists(list, ec)) return list.string();
  }
  if (fs::exists(root, ec) && !fs::is_empty(root, ec)) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir, " exists but does not hold the pipeline-overhead data set"));
  }
  const fs::path tmp = absl::StrCat(dir, ".tmp.", getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create ", tmp.string()));
  auto fail = [&](absl::Status s) {
    fs::remove_all(tmp, ec);
    return s;
  };
  for (int i = 0; i < distinct; ++i) {
    const std::vector<uint8_t> rgb = MakePhotoLikeImage(8, 8, uint64_t(i) + 1);
    absl::StatusOr<std::string> jpeg = EncodeJpeg(rgb.data(), 8, 8, 90, false);
    if (!jpeg.ok()) return fail(jpeg.status());
    std::ofstream out(tmp / absl::StrCat("img_", i, ".jpg"), std::ios::binary);
    out << *jpeg;
    if (!out) return fail(absl::DataLossError(absl::StrCat("cannot write in ", tmp.string())));
  }
  {
    std::ofstream out(tmp / "list.txt");
    for (int64_t k = 0; k < samples; ++k)
      out << "img_" << k % distinct << ".jpg " << k % 10 << "\n";
    std::ofstream marker(tmp / ".complete");
    marker << marker_text;
    if (!out || !marker) return fail(absl::DataLossError("cannot write the list file"));
  }
  fs::remove(root, ec);  // an empty directory, if any
  fs::rename(tmp, root, ec);
  if (ec) {
    fs::remove_all(tmp, ec);
    // Another process may have made it meanwhile.
    if (fs::exists(list)) return list.string();
    return absl::ErrnoToStatus(ec.value(), absl::StrCat("cannot create ", dir));
  }
  return list.string();
}

absl::StatusOr<TinyCost> MeasureReadAndDecode(const std::vector<std::string>& files,
                                              int64_t samples) {
  if (files.empty()) return absl::InvalidArgumentError("read+decode cost: no files");
  TjHandle tj(tjInitDecompress());
  if (tj == nullptr) return absl::InternalError("tjInitDecompress failed");
  std::string bytes;
  std::vector<uint8_t> rgb;
  auto one = [&](int64_t k) -> absl::Status {
    const std::string& path = files[size_t(k) % files.size()];
    if (absl::Status s = ReadFile(path, &bytes); !s.ok()) return s;
    return DecodeFull(tj.get(), bytes, path, &rgb).status();
  };
  for (int64_t k = 0; k < std::min<int64_t>(samples, 256); ++k) {
    if (absl::Status s = one(k); !s.ok()) return s;
  }
  TinyCost cost;
  const Clock::time_point start = Clock::now();
  for (int64_t k = 0; k < samples; ++k) {
    if (absl::Status s = one(k); !s.ok()) return s;
  }
  cost.seconds = SecondsSince(start);
  cost.samples = samples;
  return cost;
}

}  // namespace feedline::bench
