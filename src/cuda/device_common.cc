// Device-independent parts of src/cuda/device.h, and the whole of it for builds without CUDA.
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cuda/device.h"

namespace feedline::cuda {

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  int index = 0;
  if (absl::StartsWith(device, "cuda:") && absl::SimpleAtoi(device.substr(5), &index) &&
      index >= 0) {
    return index;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("device: expected \"cpu\", \"cuda\" or \"cuda:N\", got \"", device, "\""));
}

#ifndef FEEDLINE_WITH_CUDA

bool Compiled() { return false; }

std::vector<DeviceInfo> Devices(std::string* why_none) {
  if (why_none) *why_none = "this build of feedline has no CUDA path (CUDA toolkit not found)";
  return {};
}

absl::Status CheckDevice(int index) {
  return absl::FailedPreconditionError(
      absl::StrCat("device: cuda:", index,
                   " requested, but this build of feedline has no CUDA path (the "
                   "CUDA toolkit was not found at build time); use device=\"cpu\""));
}

HostAllocator* PinnedHostAllocator(int) { return nullptr; }

absl::StatusOr<std::unique_ptr<CopyStage>> CopyStage::Create(int device, int64_t, int, DType,
                                                             Layout, const std::array<double, 3>&,
                                                             const std::array<double, 3>&) {
  return CheckDevice(device);
}

#endif  // FEEDLINE_WITH_CUDA

}  // namespace feedline::cuda
