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

absl::Status CheckConversions(const DeviceStageSpec& spec) {
  if (spec.conversions.size() > 1) {
    return absl::InvalidArgumentError("device: at most one field may be converted on the device");
  }
  for (const DeviceConversion& c : spec.conversions) {
    const bool in_range = c.field >= 0 && c.field < spec.schema.size();
    const Field* f = in_range ? &spec.schema.field(c.field) : nullptr;
    bool pixels = f != nullptr && c.size > 0 && f->dtype() == DType::kUint8 && !f->variable() &&
                  f->rank() == 3;
    for (int d = 0; pixels && d < 3; ++d) {
      pixels = f->shape()[size_t(d)].size == (d < 2 ? c.size : 3);
    }
    if (!pixels) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device: the conversion of field ", c.field,
          in_range ? absl::StrCat(" (\"", f->name(), "\")") : std::string(" (no such field)"),
          " needs a fixed uint8 field [", c.size, ", ", c.size, ", 3]"));
    }
  }
  return absl::OkStatus();
}

}  // namespace feedline::cuda

namespace feedline {

absl::StatusOr<DeviceChoice> ChooseDevice(const std::string& device) {
  absl::StatusOr<int> index = cuda::ParseDevice(device);
  if (!index.ok()) return index.status();
  DeviceChoice choice;
  choice.device = *index;
  if (*index < 0) return choice;
  // Fails at once, with the reason, on a machine without a GPU or driver.
  if (absl::Status s = cuda::CheckDevice(*index); !s.ok()) return s;
  choice.allocator = cuda::PinnedHostAllocator(*index);
  choice.make_stage =
      [index = *index](DeviceStageSpec spec) -> absl::StatusOr<std::unique_ptr<DeviceStage>> {
    absl::StatusOr<std::unique_ptr<cuda::CopyStage>> stage =
        cuda::CopyStage::Create(index, std::move(spec));
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<DeviceStage>(*std::move(stage));
  };
  return choice;
}

}  // namespace feedline
