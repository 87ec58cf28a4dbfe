// The GPU check's LibTorch part: feedline's LibTorch adapter (include/feedline/torch.h) built
// against a CUDA LibTorch and run on the GPU, beside tests/gpu/gpu_check.py's Python checks.
// tests/gpu/run.sh builds it against the lent machine's torch (its CMake package) and runs it;
// without a GPU (CI, Debian's CPU-only LibTorch) it runs the CPU-side parts ("dry run").
//
//   feedline_torch_cuda_check --out FILE [--data DIR] [--expect-gpu]
//
// With a GPU, each check is a pass/fail in FILE's JSON:
// - the batches of a "cuda" loader equal the CPU loader's, bit for bit (uint8 NCHW, float32
//   NCHW, float16 NHWC: the conversion runs on the GPU), labels and indices too, on the current
//   device, read on a side stream that is the current c10 stream (the adapter's stream seam);
// - a reduction queued on that side stream right after `next()` sees the finished copy;
// - the calling thread's current device is the same after creating, iterating and destroying a
//   loader;
// - "cuda:1": with two GPUs, batches land on GPU 1 while the current device stays 0; with one,
//   the loader is refused with a feedline::Error and the current device is untouched.
// Without a GPU: the CPU loader's batches (reproducible), and "cuda" refused at once with a device
// error. Exit status 0 only if every check passed (with --expect-gpu, a missing GPU fails).
#include <torch/torch.h>
#undef CHECK  // glog's, from Debian's LibTorch headers
#ifdef FEEDLINE_CHECK_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "feedline/torch.h"
#include "synthetic_images.h"

namespace {

namespace fs = std::filesystem;
using feedline::LoaderOptions;

struct Report {
  std::map<std::string, std::string> values;  // name -> JSON value
  bool ok = true;

  void Check(const std::string& name, bool passed, const std::string& detail = "") {
    values[name] = passed ? "true" : "false";
    ok &= passed;
    std::printf("%-34s %s%s%s\n", name.c_str(), passed ? "ok" : "FAILED",
                detail.empty() ? "" : ": ", detail.c_str());
    std::fflush(stdout);
  }
  // Runs `fn`; an exception is a failed check, and the next one still runs.
  void Run(const std::string& name, const std::function<bool(std::string*)>& fn) {
    std::string detail;
    bool passed = false;
    try {
      passed = fn(&detail);
    } catch (const std::exception& e) {
      detail = std::string("threw: ") + e.what();
    }
    Check(name, passed, detail);
  }
  bool Save(const std::string& path) const {
    std::ofstream out(path);
    out << "{\n";
    for (auto it = values.begin(); it != values.end(); ++it) {
      out << "  \"" << it->first << "\": " << it->second << ",\n";
    }
    out << "  \"ok\": " << (ok ? "true" : "false") << "\n}\n";
    return bool(out);
  }
};

LoaderOptions Eval(feedline::DType dtype, feedline::Layout layout) {
  return LoaderOptions()
      .transform(feedline::Transform::kEval)
      .batch_size(16)
      .size(96)
      .resize_size(110)
      .seed(5)
      .dtype(dtype)
      .layout(layout)
      .shuffle(true);
}

struct Epoch {
  std::vector<at::Tensor> data, target, index;
};

// One epoch of `loader`, each tensor copied to the CPU (a GPU copy waits on the current stream).
// With `on_device`: whether every batch's data and target were on CUDA device `device`.
Epoch Collect(feedline::torch::DataLoader& loader, int device = -1, bool* on_device = nullptr) {
  Epoch e;
  for (auto& b : loader) {
    if (on_device != nullptr) {
      *on_device = *on_device && b.data.is_cuda() && b.target.is_cuda() &&
                   b.data.device().index() == device && b.target.device().index() == device;
    }
    e.data.push_back(b.data.to(torch::kCPU).clone());
    e.target.push_back(b.target.to(torch::kCPU).clone());
    e.index.push_back(b.index.to(torch::kCPU).clone());
  }
  return e;
}

bool Same(const Epoch& a, const Epoch& b, std::string* detail) {
  if (a.data.size() != b.data.size()) {
    *detail = std::to_string(a.data.size()) + " vs " + std::to_string(b.data.size()) + " batches";
    return false;
  }
  for (size_t i = 0; i < a.data.size(); ++i) {
    if (!a.data[i].equal(b.data[i]) || !a.target[i].equal(b.target[i]) ||
        !a.index[i].equal(b.index[i])) {
      const double diff =
          (a.data[i].to(torch::kFloat) - b.data[i].to(torch::kFloat)).abs().max().item<double>();
      *detail = "batch " + std::to_string(i) + " differs (max |diff| " + std::to_string(diff) + ")";
      return false;
    }
  }
  *detail = std::to_string(a.data.size()) + " batches identical";
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "torch_cuda_check.json", data;
  bool expect_gpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--out" && i + 1 < argc) {
      out = argv[++i];
    } else if (a == "--data" && i + 1 < argc) {
      data = argv[++i];
    } else if (a == "--expect-gpu") {
      expect_gpu = true;
    } else {
      std::fprintf(stderr, "usage: %s --out FILE [--data DIR] [--expect-gpu]\n", argv[0]);
      return 2;
    }
  }
  Report r;
  fs::path tmp;
  if (data.empty()) {
    tmp = fs::temp_directory_path() / ("feedline_torch_cuda_check_" + std::to_string(::getpid()));
    data = tmp.string();
    if (absl::Status s = feedline::bench::MakeImageFolder(data, 3, 24, /*seed=*/3); !s.ok()) {
      std::fprintf(stderr, "cannot make the data set: %s\n", s.ToString().c_str());
      return 2;
    }
  }
  const bool cuda = torch::cuda::is_available();
  const int gpus = cuda ? int(torch::cuda::device_count()) : 0;
  std::printf("LibTorch %s, CUDA available: %s, GPUs: %d\n", TORCH_VERSION, cuda ? "yes" : "no",
              gpus);
  r.values["torch_version"] = std::string("\"") + TORCH_VERSION + "\"";
  r.values["gpus"] = std::to_string(gpus);

  const struct {
    const char* name;
    feedline::DType dtype;
    feedline::Layout layout;
  } kCases[] = {{"uint8_NCHW", feedline::DType::kUint8, feedline::Layout::kNCHW},
                {"float32_NCHW", feedline::DType::kFloat32, feedline::Layout::kNCHW},
                {"float16_NHWC", feedline::DType::kFloat16, feedline::Layout::kNHWC}};
  std::map<std::string, Epoch> reference;
  r.Run("cpu_reference", [&](std::string* detail) {
    for (const auto& c : kCases) {
      auto loader = feedline::torch::make_data_loader(data, Eval(c.dtype, c.layout));
      reference[c.name] = Collect(*loader);
    }
    int64_t n = 0;
    for (const at::Tensor& t : reference["uint8_NCHW"].target) n += t.numel();
    *detail = std::to_string(n) + " images";
    return n == 72;
  });

  // The reference the GPU batches are compared with is itself reproducible.
  r.Run("cpu_reference_repeats", [&](std::string* detail) {
    auto loader = feedline::torch::make_data_loader(
        data, Eval(feedline::DType::kFloat16, feedline::Layout::kNHWC));
    return Same(reference["float16_NHWC"], Collect(*loader), detail);
  });
  if (!cuda) {
    r.Run("no_gpu_refused", [&](std::string* detail) {
      const auto t0 = std::chrono::steady_clock::now();
      try {
        feedline::torch::make_data_loader(
            data, Eval(feedline::DType::kUint8, feedline::Layout::kNCHW).device("cuda"));
      } catch (const feedline::Error& e) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        *detail = std::string(e.what()) + " (" + std::to_string(s) + " s)";
        return e.code() == absl::StatusCode::kFailedPrecondition && s < 2.0;
      }
      *detail = "a \"cuda\" loader was created without a GPU";
      return false;
    });
    if (expect_gpu) r.Check("gpu_present", false, "no GPU visible to LibTorch");
  }
#ifdef FEEDLINE_CHECK_WITH_CUDA
  if (cuda) {
    c10::cuda::set_device(0);
    // Every GPU loader's batches are read on a side stream made the current one, as a
    // training loop under a c10::cuda::CUDAStreamGuard would.
    c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(/*isHighPriority=*/false, 0);
    c10::cuda::CUDAStreamGuard guard(side);
    for (const auto& c : kCases) {
      r.Run(std::string("equal_") + c.name, [&](std::string* detail) {
        auto loader =
            feedline::torch::make_data_loader(data, Eval(c.dtype, c.layout).device("cuda"));
        loader->set_cuda_stream(c10::cuda::getCurrentCUDAStream().stream());
        bool on_device = true;
        const bool same = Same(reference[c.name], Collect(*loader, 0, &on_device), detail);
        if (!on_device) *detail += "; a batch not on cuda:0";
        return same && on_device;
      });
    }
    r.Run("side_stream_sees_copy", [&](std::string* detail) {
      // A reduction queued on the side stream right after next(): the stream waited for the
      // copy, so the sums equal the CPU batches' (no host synchronisation in between).
      auto loader = feedline::torch::make_data_loader(
          data, Eval(feedline::DType::kUint8, feedline::Layout::kNCHW).device("cuda"));
      loader->set_cuda_stream(side.stream());
      std::vector<at::Tensor> sums;
      for (auto& b : *loader) sums.push_back(b.data.to(torch::kLong).sum());
      const Epoch& ref = reference["uint8_NCHW"];
      if (sums.size() != ref.data.size()) return false;
      for (size_t i = 0; i < sums.size(); ++i) {
        if (sums[i].item<int64_t>() != ref.data[i].to(torch::kLong).sum().item<int64_t>()) {
          *detail = "batch " + std::to_string(i) + ": the sum differs";
          return false;
        }
      }
      return true;
    });
    r.Run("current_device_untouched", [&](std::string* detail) {
      const int before = c10::cuda::current_device();
      {
        auto loader = feedline::torch::make_data_loader(
            data, Eval(feedline::DType::kFloat16, feedline::Layout::kNCHW).device("cuda"));
        for (auto& b : *loader) (void)b;
      }
      const int after = c10::cuda::current_device();
      *detail = std::to_string(before) + " -> " + std::to_string(after);
      return before == after;
    });
    r.Run(gpus >= 2 ? "cuda1_while_current_0" : "cuda1_refused_on_one_gpu",
          [&](std::string* detail) {
            c10::cuda::set_device(0);
            if (gpus >= 2) {
              auto loader = feedline::torch::make_data_loader(
                  data, Eval(feedline::DType::kUint8, feedline::Layout::kNCHW).device("cuda:1"));
              bool on_1 = true;
              Epoch gpu;
              {
                c10::cuda::CUDAStreamGuard g1(c10::cuda::getStreamFromPool(false, 1));
                loader->set_cuda_stream(c10::cuda::getCurrentCUDAStream(1).stream());
                gpu = Collect(*loader, 1, &on_1);
              }
              const bool same = Same(reference["uint8_NCHW"], gpu, detail);
              const int now = c10::cuda::current_device();
              *detail += "; current device " + std::to_string(now);
              return same && on_1 && now == 0;
            }
            try {
              feedline::torch::make_data_loader(
                  data, Eval(feedline::DType::kUint8, feedline::Layout::kNCHW).device("cuda:1"));
            } catch (const feedline::Error& e) {
              const int now = c10::cuda::current_device();
              *detail = std::string(e.what()) + "; current device " + std::to_string(now);
              return now == 0;
            }
            *detail = "cuda:1 accepted on a one-GPU machine";
            return false;
          });
  }
#else
  if (cuda)
    r.Check("built_with_cuda", false,
            "LibTorch sees a GPU but this check was built without c10_cuda");
#endif
  if (!tmp.empty()) fs::remove_all(tmp);
  if (!r.Save(out)) std::fprintf(stderr, "cannot write %s\n", out.c_str());
  std::printf("LibTorch GPU check: %s (%s)\n", r.ok ? "PASSED" : "FAILED", out.c_str());
  return r.ok ? 0 : 1;
}
