// The video built-in's one-call loader (feedline/video.h): files -> clips.
#include "feedline/files.h"
#include "feedline/video.h"

namespace feedline::video {

absl::StatusOr<std::unique_ptr<Loader>> MakeVideoLoader(const ClipOptions& clip,
                                                        LoaderOptions options) {
  absl::StatusOr<std::shared_ptr<SampleTransform>> transform = MakeClipTransform(clip, options);
  if (!transform.ok()) return transform.status();
  if (options.source().empty() && options.shards().empty()) {
    return InvalidOption("source", "must not be empty");
  }
  // WebDataset shards (a .tar, a brace pattern, or shards given): a sample per key, its video
  // the member with a video extension, its label the .cls member's.
  const std::string& source = options.source();
  const bool shards = !options.shards().empty() || LooksLikeShards(source);
  absl::StatusOr<std::shared_ptr<FileDataset>> files =
      shards
          ? OpenWebDataset(source, options.shards(), ReadLimitsOf(options))
          : FileDataset::Open(source, options.shards(), ReadLimitsOf(options), VideoExtensions());
  if (!files.ok()) return files.status();
  // Several clips of each video: each record read as clips_per_video samples.
  return Loader::Create(ClipsOf(*std::move(files), clip.clips_per_video), *std::move(transform),
                        std::move(options));
}

}  // namespace feedline::video
