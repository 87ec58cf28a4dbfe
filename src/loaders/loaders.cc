// The image built-in's factory (include/feedline/loader.h: Loader::Create(LoaderOptions)) and
// the build's description: files (io/) read, images (image/) decoded, the image field converted
// on the device (engine/device_stage.h), handed to the engine (engine/engine_parts.h). The
// generic factory is the engine's own (engine/create.cc).
#include <jconfig.h>

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cuda/device.h"
#include "engine/engine_parts.h"
#include "feedline/files.h"
#include "feedline/image.h"
#include "feedline/loader.h"
#include "feedline/mix.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Loader>> Loader::Create(LoaderOptions options) {
  if (absl::Status s = image::ValidateOptions(options); !s.ok()) return s;
  if (options.source().empty() && options.shards().empty()) {
    return InvalidOption("source", "must not be empty");
  }
  absl::StatusOr<std::shared_ptr<FileDataset>> files =
      FileDataset::Open(options.source(), options.shards(), ReadLimitsOf(options));
  if (!files.ok()) return files.status();
  if (options.synthetic()) {
    return CreateImages(std::make_shared<LabelsOnlyDataset>(*files), std::move(options));
  }
  return CreateImages(*std::move(files), std::move(options));
}

absl::StatusOr<std::unique_ptr<Loader>> Loader::CreateImages(std::shared_ptr<const Dataset> dataset,
                                                             LoaderOptions options) {
  if (dataset == nullptr) return InvalidOption("dataset", "must not be null");
  if (absl::Status s = image::ValidateOptions(options); !s.ok()) return s;
  internal::EngineParts parts;
  absl::StatusOr<DeviceChoice> device = ChooseDevice(options.device());
  if (!device.ok()) return device.status();
  parts.device = *std::move(device);
  // On a GPU, uint8 HWC crosses PCIe and the device normalises (the transform asks for it).
  auto transform = std::make_shared<ImageTransform>(
      ImageTransformConfig::From(options, parts.device.device >= 0));
  parts.dataset = std::move(dataset);
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

absl::StatusOr<std::unique_ptr<Loader>> Loader::CreateImages(
    std::shared_ptr<const Mix> mix, const std::vector<LoaderOptions>& per_source,
    LoaderOptions options) {
  if (mix == nullptr) return InvalidOption("dataset", "must not be null");
  if (int(per_source.size()) != mix->num_sources()) {
    return InvalidOption("source_options",
                         absl::StrCat(per_source.size(), " for ", mix->num_sources(), " sources"));
  }
  if (absl::Status s = image::ValidateOptions(options); !s.ok()) return s;
  if (options.cache() == Cache::kDecoded) {
    return InvalidOption("cache", "'decoded' with per-source image options: use 'bytes'");
  }
  absl::StatusOr<DeviceChoice> device = ChooseDevice(options.device());
  if (!device.ok()) return device.status();
  std::vector<std::shared_ptr<const SampleTransform>> transforms;
  for (size_t s = 0; s < per_source.size(); ++s) {
    const LoaderOptions& o = per_source[s];
    if (absl::Status st = image::ValidateOptions(o); !st.ok()) {
      return InvalidOption(absl::StrCat("sources[", s, "]"), std::string(st.message()));
    }
    auto differs = [&](absl::string_view name) {
      return InvalidOption(absl::StrCat("sources[", s, "]: ", name),
                           "must be the loader's (it shapes every sample of the batch)");
    };
    if (o.size() != options.size()) return differs("size");
    if (o.layout() != options.layout()) return differs("layout");
    if (o.dtype() != options.dtype()) return differs("dtype");
    if (o.mean() != options.mean()) return differs("mean");
    if (o.stddev() != options.stddev()) return differs("stddev");
    transforms.push_back(
        std::make_shared<ImageTransform>(ImageTransformConfig::From(o, device->device >= 0)));
  }
  absl::StatusOr<std::shared_ptr<SampleTransform>> transform =
      PerSourceTransform(mix, std::move(transforms));
  if (!transform.ok()) return transform.status();
  internal::EngineParts parts;
  parts.device = *std::move(device);
  parts.dataset = std::move(mix);
  parts.transform = *std::move(transform);
  parts.read_bytes_hint = int64_t{1} << 20;
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
