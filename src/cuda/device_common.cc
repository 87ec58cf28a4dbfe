// Device-independent parts of src/cuda/device.h (device_cuda.cc has the rest with CUDA,
// device_none.cc without).
#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "feedline/error.h"

namespace feedline::cuda {

int CurrentDevice();  // device_cuda.cc; device_none.cc: 0

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

}  // namespace feedline::cuda
