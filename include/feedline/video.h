// feedline — the video built-in: clips of frames from video files, decoded with FFmpeg's
// libraries (libavformat, libavcodec, libswscale) in the map stage's workers.
//
// A sample is one clip of one video: `clip_len` frames, `frame_step` frames apart (in frames of
// the stream's average rate), or `fps` frames a second (resampled by timestamps: right for
// variable-frame-rate files). The frame of a clip at time t is the frame on screen at t: the
// last one whose presentation timestamp is at or before t, so the frames delivered are the
// frames with those timestamps for files with B-frames, open GOPs, variable frame rates and
// edit lists (the container's own timestamps, as PyAV and ffprobe show them). A clip that runs
// past the end repeats the last frame.
//
// Where a clip starts comes from (seed, epoch, index): for the train transform a frame drawn
// uniformly among those where the whole clip fits; for eval the middle one (with several clips
// per video, ClipOptions::clips_per_video, spread evenly; ClipStarts chooses either way). The crop
// is drawn once per clip and applied to every frame (train: torchvision's RandomResizedCrop box and
// a horizontal flip with p = 0.5; eval: the shorter side resized to `resize_size`, the centre
// `size` x `size`). Only what the clip needs is decoded: a seek to the keyframe at or before
// its first frame, then forward to its last; frames between the sampled ones are decoded (the
// codec needs them) but not converted. Each sampled frame is scaled and converted by swscale
// straight into its place in the batch: "clips" uint8 [T, 3, size, size] per sample (a batch:
// [B, T, C, H, W]), "label" int64. FFmpeg's own threads are off: the engine's workers decode
// clips side by side.
//
// Bad input — a truncated file, a corrupt packet, no video stream, an unsupported codec,
// absurd dimensions (above max_image_pixels) or timestamps — is the sample's error naming the
// file (on_error="skip" replaces it), never a crash or a hang.
#ifndef FEEDLINE_VIDEO_H_
#define FEEDLINE_VIDEO_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "feedline/dataset.h"
#include "feedline/loader.h"
#include "feedline/options.h"
#include "feedline/transform.h"

namespace feedline::video {

// Where a video's clips start: drawn from (seed, epoch, index) among the frames where the clip
// fits, or spread evenly over them (clip k of K at (2k + 1) / 2K of the room: one clip is the
// middle one). kAuto: random for the train transform, uniform for eval.
enum class ClipStarts { kAuto, kRandom, kUniform };

struct ClipOptions {
  int clip_len = 16;   // frames per clip, 1..1024
  int frame_step = 1;  // frames of the stream between two of the clip's, 1..1024
  double fps = 0;      // > 0: the clip's frames this many a second instead (by timestamps)
  // Clips of each video per epoch, 1..1024: sample i is clip i % K of video i / K (ClipsOf), so
  // an epoch has K samples per video, shuffled and split over the ranks like any others.
  int clips_per_video = 1;
  ClipStarts starts = ClipStarts::kAuto;
  // > 0: the clip's audio too, resampled to this many samples a second (8000..192000), as
  // "audio" float32 [audio_channels, S] (sample j: the file's audio at t0 + j / audio_rate, t0
  // the clip's first frame's time) and "audio_samples" int64 (how many of the S hold the
  // file's audio; the rest are 0: a file without audio, or a clip past the audio's end).
  // S = audio_rate * audio_seconds; audio_seconds 0: the clip's span, clip_len / fps (with
  // frame_step the span depends on each file's frame rate, so audio_seconds must be given).
  int audio_rate = 0;
  int audio_channels = 1;  // 1 (mono) or 2 (stereo): FFmpeg's rematrixing
  double audio_seconds = 0;
};
// The samples of a clip's audio field, per channel (0 without audio).
int64_t AudioSamples(const ClipOptions& clip);
absl::Status ValidateClipOptions(const ClipOptions& clip);

// The samples of `videos` with each record `clips_per_video` times: sample i reads record
// i / K and is its clip i % K (the transform draws its start and crop from i, and spreads
// uniform starts by i % K). Errors name the file and the clip. Reads are the videos' own
// (asynchronous when theirs are); the fingerprint is theirs with K.
std::shared_ptr<const Dataset> ClipsOf(std::shared_ptr<const Dataset> videos, int clips_per_video);

// The file extensions of an ImageFolder-like folder of videos, lowercase, with the dot.
const std::vector<std::string>& VideoExtensions();

// The transform from a video file's bytes to one clip, with the image options of `options`
// (transform train or eval, size, resize_size, scale, ratio, flip, max_image_pixels).
// Layout NCHW and dtype uint8 only (kInvalidArgument otherwise).
absl::StatusOr<std::shared_ptr<SampleTransform>> MakeClipTransform(const ClipOptions& clip,
                                                                   const LoaderOptions& options);

// A loader of clips from `options.source()`: a folder with one sub-folder of videos per class
// (VideoExtensions), or a list file of "path label" lines (paths or URLs), with the engine's
// options (batch size, shuffle, seed, ranks, workers, resume, ...).
absl::StatusOr<std::unique_ptr<Loader>> MakeVideoLoader(const ClipOptions& clip,
                                                        LoaderOptions options);

}  // namespace feedline::video

#endif  // FEEDLINE_VIDEO_H_
