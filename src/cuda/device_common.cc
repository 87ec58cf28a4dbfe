// Device-independent parts of src/cuda/device.h (device_cuda.cc has the rest with CUDA,
// device_none.cc without).
#include <cstdlib>
#include <utility>

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

namespace feedline::internal {

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& device,
                                          std::optional<PixelConversion> conversion) {
  absl::StatusOr<int> index = cuda::ParseDevice(device);
  if (!index.ok()) return index.status();
  DeviceChoice choice;
  choice.device = *index;
  if (*index < 0) return choice;
  // Fails at once, with the reason, on a machine without a GPU or driver.
  if (absl::Status s = cuda::CheckDevice(*index); !s.ok()) return s;
  choice.allocator = cuda::PinnedHostAllocator(*index);
  choice.make_stage = [index = *index, conversion](std::shared_ptr<const SlotLayout> layout)
      -> absl::StatusOr<std::unique_ptr<DeviceStage>> {
    absl::StatusOr<std::unique_ptr<cuda::CopyStage>> stage =
        cuda::CopyStage::Create(index, std::move(layout), conversion);
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<DeviceStage>(*std::move(stage));
  };
  return choice;
}

}  // namespace feedline::internal
