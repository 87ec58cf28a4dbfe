// The video built-in's transform (feedline/video.h): a file's bytes -> one clip of frames.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/crop.h"
#include "feedline/video.h"
#include "video/audio_decoder.h"
#include "video/clip_decoder.h"
#include "video/frame_convert.h"

extern "C" {
#include <libavutil/frame.h>
#include <libavutil/mathematics.h>
}

namespace feedline::video {
namespace {

struct ClipConfig {
  ClipOptions clip;
  bool train = true;
  bool random_starts = true;
  int size = 112, resize_size = 128;
  std::pair<double, double> scale, ratio;
  bool flip = true;
  int64_t max_pixels = 0;
};

class ClipTransform final : public SampleTransform {
 public:
  explicit ClipTransform(ClipConfig c) : c_(c), audio_(AudioSamples(c.clip)), schema_(Fields(c)) {}

  const Schema& schema() const override { return schema_; }
  bool ReadsOptions(OptionGroup group) const override { return group == OptionGroup::kImage; }

  struct State : WorkerState {
    ClipDecoder decoder;
    FrameConverter convert;
    AudioDecoder audio;
  };
  std::unique_ptr<WorkerState> NewWorkerState() const override { return std::make_unique<State>(); }

  absl::Status Apply(const Record& record, const SampleContext& ctx, WorkerState* state,
                     SampleWriter& out) const override {
    auto* s = static_cast<State*>(state);
    const std::vector<uint8_t>* video = VideoBytes(record);
    if (video == nullptr) {
      return absl::DataLossError(absl::StrCat("video: the sample has no video member (one of ",
                                              absl::StrJoin(VideoExtensions(), " "), ")"));
    }
    if (absl::Status st = s->decoder.Open(video->data(), video->size(), c_.max_pixels); !st.ok()) {
      return st;
    }
    const VideoInfo v = s->decoder.info();  // (Decode may reopen the file)
    const std::vector<int64_t> targets = Targets(v, ctx);
    const Crop crop = CropOf(v, ctx);
    uint8_t* clip = out.Fixed<uint8_t>(0);
    const size_t frame_bytes = size_t(3) * size_t(c_.size) * size_t(c_.size);
    int64_t last_pts = AV_NOPTS_VALUE;
    absl::Status st = s->decoder.Decode(targets, [&](size_t i, const AVFrame* f) -> absl::Status {
      uint8_t* dst = clip + i * frame_bytes;
      const int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
      if (i > 0 && pts == last_pts) {  // the same frame on screen: already converted
        std::memcpy(dst, dst - frame_bytes, frame_bytes);
        return absl::OkStatus();
      }
      last_pts = pts;
      return s->convert.Into(f, crop, c_.size, dst);
    });
    s->decoder.Close();
    if (!st.ok()) return st;
    *out.Fixed<int64_t>(1) = record.label;
    if (audio_ > 0) {  // from the clip's first frame's time, on the container's clock
      const double t0 = double(targets.front()) * v.time_base_num / v.time_base_den;
      absl::StatusOr<int64_t> got =
          s->audio.Decode(video->data(), video->size(), t0, audio_, c_.clip.audio_rate,
                          c_.clip.audio_channels, out.Fixed<float>(2));
      if (!got.ok()) return got.status();
      *out.Fixed<int64_t>(3) = *got;
    }
    return absl::OkStatus();
  }

 private:
  // The file: a record's bytes, or a WebDataset sample's member with a video extension.
  static const std::vector<uint8_t>* VideoBytes(const Record& record) {
    if (record.members.empty()) return &record.bytes;
    for (const Record::Member& m : record.members) {
      for (const std::string& ext : VideoExtensions()) {
        if (absl::EqualsIgnoreCase(m.name, absl::string_view(ext).substr(1))) return &m.bytes;
      }
    }
    return nullptr;
  }

  // The clip's timestamps: clip_len frames from a start drawn from (seed, epoch, index) among
  // the frames where the whole clip fits (random starts), or clip k of K (the sample's index
  // mod clips_per_video) at (2k + 1) / 2K of them (uniform: one clip is the middle one).
  std::vector<int64_t> Targets(const VideoInfo& v, const SampleContext& ctx) const {
    const AVRational tb{v.time_base_num, v.time_base_den};
    const AVRational period{v.fps_den, v.fps_num};  // one frame at the average rate
    const int n = c_.clip.clip_len;
    // The clip's extent in frames of the average rate.
    int64_t span = int64_t(n - 1) * c_.clip.frame_step;
    if (c_.clip.fps > 0) {
      span = int64_t(std::ceil(double(n - 1) / c_.clip.fps * av_q2d(av_inv_q(period)) - 1e-9));
    }
    const int64_t room = v.frames - 1 - span;  // the last start where the clip fits
    int64_t start = 0;
    if (room > 0) {
      if (c_.random_starts) {
        SampleRng rng(ctx.seed(), uint64_t(ctx.epoch()), uint64_t(ctx.index()), kRngClip);
        start = int64_t(rng.Below(uint64_t(room) + 1));
      } else {
        const int64_t K = c_.clip.clips_per_video, k = ctx.index() % K;
        start =
            int64_t(static_cast<unsigned __int128>(room) * uint64_t(2 * k + 1) / uint64_t(2 * K));
      }
    }
    std::vector<int64_t> t(static_cast<size_t>(n));
    const int64_t t0 = v.start_pts + av_rescale_q(start, period, tb);
    for (int i = 0; i < n; ++i) {
      t[size_t(i)] =
          c_.clip.fps > 0
              ? t0 + int64_t(std::llround(double(i) / c_.clip.fps / av_q2d(tb)))
              : v.start_pts + av_rescale_q(start + int64_t(i) * c_.clip.frame_step, period, tb);
    }
    return t;
  }

  // The crop every frame of the clip gets: torchvision's RandomResizedCrop box and a flip
  // (train), or the source rectangle of Resize(resize_size) + CenterCrop(size) (eval; a
  // window wider than the resized frame is the whole frame).
  Crop CropOf(const VideoInfo& v, const SampleContext& ctx) const {
    Crop c;
    if (c_.train) {
      SampleRng crop_rng(ctx.seed(), uint64_t(ctx.epoch()), uint64_t(ctx.index()), kRngCrop);
      const CropBox box = RandomResizedCropBox(v.width, v.height, c_.scale, c_.ratio, crop_rng);
      c = Crop{box.left, box.top, box.width, box.height, false};
      c.flip =
          c_.flip &&
          SampleRng(ctx.seed(), uint64_t(ctx.epoch()), uint64_t(ctx.index()), kRngFlip).Uniform() <
              0.5;
      return c;
    }
    const EvalGeometry g = ComputeEvalGeometry(v.width, v.height, c_.resize_size, c_.size);
    const double sx = double(v.width) / double(g.resized_w);
    const double sy = double(v.height) / double(g.resized_h);
    auto span = [](int64_t offset, int size, int64_t resized, double scale, int whole, int* at,
                   int* len) {
      const int64_t lo = std::max<int64_t>(offset, 0),
                    hi = std::min<int64_t>(offset + size, resized);
      *at = std::clamp(int(std::lround(double(lo) * scale)), 0, whole - 1);
      *len = std::clamp(int(std::lround(double(hi - lo) * scale)), 1, whole - *at);
    };
    span(g.crop_left, c_.size, g.resized_w, sx, v.width, &c.x, &c.w);
    span(g.crop_top, c_.size, g.resized_h, sy, v.height, &c.y, &c.h);
    return c;
  }

  static Schema Fields(const ClipConfig& c) {
    std::vector<Field> f = {Field("clips", DType::kUint8, {c.clip.clip_len, 3, c.size, c.size}),
                            Field("label", DType::kInt64, {})};
    if (c.clip.audio_rate > 0) {
      f.push_back(Field("audio", DType::kFloat32, {c.clip.audio_channels, AudioSamples(c.clip)}));
      f.push_back(Field("audio_samples", DType::kInt64, {}));
    }
    return Schema(std::move(f));
  }

  const ClipConfig c_;
  const int64_t audio_;  // samples of the audio field per channel (0: none)
  const Schema schema_;
};

}  // namespace

absl::Status ValidateClipOptions(const ClipOptions& clip) {
  if (clip.clip_len < 1 || clip.clip_len > 1024) {
    return InvalidOption("clip_len", "must be in [1, 1024]");
  }
  if (clip.frame_step < 1 || clip.frame_step > 1024) {
    return InvalidOption("frame_step", "must be in [1, 1024]");
  }
  if (!(clip.fps >= 0 && clip.fps <= 10000)) {
    return InvalidOption("fps", "must be 0 (frame_step) or a rate in (0, 10000]");
  }
  if (clip.clips_per_video < 1 || clip.clips_per_video > 1024) {
    return InvalidOption("clips_per_video", "must be in [1, 1024]");
  }
  if (clip.audio_rate != 0) {
    if (clip.audio_rate < 8000 || clip.audio_rate > 192000) {
      return InvalidOption("audio_rate", "must be 0 (no audio) or in [8000, 192000]");
    }
    if (clip.audio_channels != 1 && clip.audio_channels != 2) {
      return InvalidOption("audio_channels", "must be 1 (mono) or 2 (stereo)");
    }
    if (!(clip.audio_seconds >= 0 && clip.audio_seconds <= 600)) {
      return InvalidOption("audio_seconds", "must be 0 (the clip's span) or in (0, 600]");
    }
    if (clip.audio_seconds == 0 && clip.fps <= 0) {
      return InvalidOption("audio_seconds",
                           "must be given with frame_step (the clip's span then depends on each "
                           "file's frame rate), or set fps");
    }
  }
  if (clip.starts != ClipStarts::kAuto && clip.starts != ClipStarts::kRandom &&
      clip.starts != ClipStarts::kUniform) {
    return InvalidOption("clip_starts", "must be random or uniform");
  }
  return absl::OkStatus();
}

int64_t AudioSamples(const ClipOptions& clip) {
  if (clip.audio_rate <= 0) return 0;
  const double seconds = clip.audio_seconds > 0 ? clip.audio_seconds
                         : clip.fps > 0         ? double(clip.clip_len) / clip.fps
                                                : 0;
  return std::max<int64_t>(1, std::llround(seconds * clip.audio_rate));
}

const std::vector<std::string>& VideoExtensions() {
  static const std::vector<std::string> kExtensions = {".mp4",  ".m4v", ".mov", ".mkv",
                                                       ".webm", ".avi", ".mpg", ".mpeg",
                                                       ".ts",   ".ogv", ".flv", ".3gp"};
  return kExtensions;
}

absl::StatusOr<std::shared_ptr<SampleTransform>> MakeClipTransform(const ClipOptions& clip,
                                                                   const LoaderOptions& o) {
  if (absl::Status s = ValidateClipOptions(clip); !s.ok()) return s;
  if (absl::Status s = ValidateOptions(o, OptionGroup::kImage); !s.ok()) return s;
  if (!(o.scale().first > 0 && o.scale().first <= o.scale().second && o.scale().second <= 1.0)) {
    return InvalidOption("scale", "must satisfy 0 < min <= max <= 1");
  }
  if (!(o.ratio().first > 0 && o.ratio().first <= o.ratio().second)) {
    return InvalidOption("ratio", "must satisfy 0 < min <= max");
  }
  if (o.layout() != Layout::kNCHW) return InvalidOption("layout", "clips are [T, C, H, W]: NCHW");
  if (o.dtype() != DType::kUint8) return InvalidOption("dtype", "clips are uint8");
  if (o.transform() == Transform::kEvalFast) {
    return InvalidOption("transform", "clips take 'train' or 'eval'");
  }
  ClipConfig c;
  c.clip = clip;
  c.train = o.transform() == Transform::kTrain;
  c.random_starts = clip.starts == ClipStarts::kAuto ? c.train : clip.starts == ClipStarts::kRandom;
  c.size = o.size();
  c.resize_size = o.resize_size();
  c.scale = o.scale();
  c.ratio = o.ratio();
  c.flip = o.flip();
  c.max_pixels = o.max_image_pixels();
  return std::shared_ptr<SampleTransform>(std::make_shared<ClipTransform>(c));
}

}  // namespace feedline::video
