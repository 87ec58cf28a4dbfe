// The loader wiring: the public factories (include/feedline/loader.h) that choose the data set,
// the transform and the device stage, and hand them to the engine (engine/engine_parts.h).
// This is the one place where the engine meets the workloads (image/, io/) and cuda/.
#include <jconfig.h>

#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "engine/engine_parts.h"
#include "feedline/image.h"
#include "feedline/loader.h"
#include "image/image_transform.h"

namespace feedline {
namespace {

// The synthetic source: labels as the data set has them, no I/O (the pipeline's own cost).
class LabelsOnlyDataset final : public DatasetWrapper {
 public:
  explicit LabelsOnlyDataset(std::shared_ptr<const FileDataset> files)
      : DatasetWrapper(files), files_(std::move(files)) {}
  absl::Status Read(int64_t index, Record* record) const override {
    record->Clear();
    record->label = files_->files().samples[size_t(index)].label;
    return absl::OkStatus();
  }

 private:
  std::shared_ptr<const FileDataset> files_;
};

// Resolves options.device() into `parts`: the device, pinned memory and the copy stage.
absl::Status ChooseDevice(const LoaderOptions& options, std::optional<cuda::ImageConversion> image,
                          internal::EngineParts* parts) {
  absl::StatusOr<int> device = cuda::ParseDevice(options.device());
  if (!device.ok()) return device.status();
  parts->device = *device;
  if (*device < 0) return absl::OkStatus();
  // Fails at once, with the reason, on a machine without a GPU or driver.
  if (absl::Status s = cuda::CheckDevice(*device); !s.ok()) return s;
  parts->allocator = cuda::PinnedHostAllocator(*device);
  const int index = *device;
  parts->make_device_stage = [index, image](std::shared_ptr<const internal::SlotLayout> layout)
      -> absl::StatusOr<std::unique_ptr<DeviceStage>> {
    absl::StatusOr<std::unique_ptr<cuda::CopyStage>> stage =
        cuda::CopyStage::Create(index, std::move(layout), image);
    if (!stage.ok()) return stage.status();
    return std::unique_ptr<DeviceStage>(*std::move(stage));
  };
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(LoaderOptions options) {
  if (absl::Status s = image::ValidateOptions(options); !s.ok()) return s;
  if (options.source().empty() && options.shards().empty()) {
    return InvalidOption("source", "must not be empty");
  }
  absl::StatusOr<std::shared_ptr<FileDataset>> files =
      FileDataset::Open(options.source(), options.shards(), options.read_timeout_ms());
  if (!files.ok()) return files.status();
  internal::EngineParts parts;
  cuda::ImageConversion conversion;
  conversion.field = ImageTransform::kImage;
  conversion.size = options.size();
  conversion.dtype = options.dtype();
  conversion.layout = options.layout();
  conversion.mean = options.mean();
  conversion.std = options.stddev();
  if (absl::Status s = ChooseDevice(options, conversion, &parts); !s.ok()) return s;
  auto transform =
      std::make_shared<ImageTransform>(ImageTransformConfig::From(options, parts.device >= 0));
  if (options.synthetic()) {
    parts.dataset = std::make_shared<LabelsOnlyDataset>(*files);
  } else {
    parts.dataset = *std::move(files);
  }
  parts.transform = transform;
  if (options.cache() == Cache::kDecoded) {
    parts.cache_holds_bytes = false;
    parts.attach_cache = [transform](std::shared_ptr<SampleCache> cache) {
      transform->AttachCache(std::move(cache));
    };
  }
  // Read buffers: ~1 MiB each is a generous bound for ImageNet-like files.
  parts.read_bytes_hint = int64_t{1} << 20;
  return internal::BuildLoader(std::move(parts), std::move(options));
}

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(
    std::shared_ptr<const Dataset> dataset, std::shared_ptr<const SampleTransform> transform,
    LoaderOptions options) {
  if (options.cache() == Cache::kDecoded) {
    return InvalidOption("cache", "\"decoded\" is the image built-in's; use \"bytes\"");
  }
  internal::EngineParts parts;
  if (absl::Status s = ChooseDevice(options, std::nullopt, &parts); !s.ok()) return s;
  parts.dataset = std::move(dataset);
  parts.transform = std::move(transform);
  parts.read_bytes_hint = int64_t{64} << 10;
  return internal::BuildLoader(std::move(parts), std::move(options));
}

BuildInfo GetBuildInfo() {
  BuildInfo info;
  info.version = FEEDLINE_VERSION;
  info.cuda_compiled = cuda::Compiled();
  info.png = true;
  for (const cuda::DeviceInfo& d : cuda::Devices(&info.cuda_unavailable_reason)) {
    info.cuda_devices.push_back(absl::StrCat("cuda:", d.index, " ", d.name, " (",
                                             d.memory_bytes >> 20, " MiB, sm_",
                                             d.compute_capability, ")"));
  }
  info.jpeg = absl::StrCat("libjpeg-turbo ", LIBJPEG_TURBO_VERSION_NUMBER / 1000000, ".",
                           LIBJPEG_TURBO_VERSION_NUMBER / 1000 % 1000, ".",
                           LIBJPEG_TURBO_VERSION_NUMBER % 1000);
  info.resize = "OpenCV imgproc";
  return info;
}

}  // namespace feedline
