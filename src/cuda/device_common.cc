// Device-independent parts of src/cuda/device.h, and the whole of it for builds without CUDA.
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "feedline/error.h"

namespace feedline::cuda {

int CurrentDevice();  // device_cuda.cc; 0 without CUDA

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return CurrentDevice();
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

int CurrentDevice() { return 0; }

std::vector<DeviceInfo> Devices(std::string* why_none) {
  if (why_none) *why_none = "this build of feedline has no CUDA path (CUDA toolkit not found)";
  return {};
}

absl::Status CheckDevice(int index) {
  return MarkDeviceError(absl::FailedPreconditionError(
      absl::StrCat("device: cuda:", index,
                   " requested, but this build of feedline has no CUDA path (the "
                   "CUDA toolkit was not found at build time); use device=\"cpu\"")));
}

HostAllocator* PinnedHostAllocator(int) { return nullptr; }

absl::StatusOr<std::unique_ptr<CopyStage>> CopyStage::Create(
    int device, std::shared_ptr<const internal::SlotLayout>, std::optional<ImageConversion>) {
  return CheckDevice(device);
}

#endif  // FEEDLINE_WITH_CUDA

}  // namespace feedline::cuda
