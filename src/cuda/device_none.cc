// src/cuda/device.h for builds without the CUDA toolkit: every entry point says that this build
// has no CUDA path. Built instead of device_cuda.cc and convert.cu.
#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "feedline/error.h"

namespace feedline::cuda {

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

absl::StatusOr<std::unique_ptr<CopyStage>> CopyStage::Create(int device, DeviceStageSpec) {
  return CheckDevice(device);
}

}  // namespace feedline::cuda
