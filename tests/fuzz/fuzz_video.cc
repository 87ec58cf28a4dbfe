// libFuzzer target: the video built-in's container, decode and conversion path (ClipDecoder and
// FrameConverter, src/video), and the clip's audio (AudioDecoder: its stream decoded and
// resampled) on any bytes as a video file. Which frames and crop are asked for
// comes from a hash of the input (the seeds stay valid videos). Properties: no crash, leak or
// hang; an opened file has a positive size within the pixel bound, a time base, a frame rate
// and at least one frame; a clip that decodes calls back exactly once per target, in order, and
// every frame converts; the audio fills at most the samples asked for, zeros elsewhere.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "fuzz_util.h"
#include "video/audio_decoder.h"
#include "video/clip_decoder.h"
#include "video/frame_convert.h"

extern "C" {
#include <libavutil/frame.h>
#include <libavutil/mathematics.h>
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static auto* decoder = new feedline::video::ClipDecoder();
  static auto* convert = new feedline::video::FrameConverter();
  static auto* audio = new feedline::video::AudioDecoder();
  constexpr int64_t kMaxPixels = int64_t{4} << 20;  // as the image decoders' fuzz bound
  feedline::fuzz::InputHash hash(data, size);
  const bool verbose = std::getenv("FEEDLINE_FUZZ_VERBOSE") != nullptr;
  if (absl::Status st = decoder->Open(data, size, kMaxPixels); !st.ok()) {
    if (verbose) std::fprintf(stderr, "open: %s\n", st.ToString().c_str());
    decoder->Close();
    return 0;
  }
  const feedline::video::VideoInfo& v = decoder->info();
  FUZZ_CHECK(v.width > 0 && v.height > 0 && int64_t(v.width) * v.height <= kMaxPixels,
             absl::StrCat(v.width, " x ", v.height));
  FUZZ_CHECK(v.time_base_num > 0 && v.time_base_den > 0 && v.fps_num > 0 && v.fps_den > 0,
             "a clock");
  FUZZ_CHECK(v.frames >= 1, absl::StrCat(v.frames));
  const int n = hash.Range(1, 6), step = hash.Range(1, 4);
  const int64_t first = int64_t(hash.Next() % uint64_t(std::min<int64_t>(v.frames, 600)));
  const AVRational period{v.fps_den, v.fps_num}, tb{v.time_base_num, v.time_base_den};
  std::vector<int64_t> targets;
  for (int i = 0; i < n; ++i) {
    targets.push_back(v.start_pts + av_rescale_q(first + int64_t(i) * step, period, tb));
  }
  const int out = hash.Range(1, 24);
  feedline::video::Crop crop;
  crop.x = hash.Range(-4, v.width);
  crop.y = hash.Range(-4, v.height);
  crop.w = hash.Range(0, v.width + 4);
  crop.h = hash.Range(0, v.height + 4);
  crop.flip = hash.Bit();
  const size_t frame_bytes = size_t(3) * size_t(out) * size_t(out);
  std::vector<uint8_t> clip(frame_bytes * size_t(n));
  size_t next = 0;
  const absl::Status st = decoder->Decode(targets, [&](size_t i, const AVFrame* f) -> absl::Status {
    FUZZ_CHECK(i == next, absl::StrCat(i, " after ", next));
    FUZZ_CHECK(f != nullptr && f->width > 0 && f->height > 0, "an empty frame");
    ++next;
    return convert->Into(f, crop, out, clip.data() + i * frame_bytes);
  });
  if (verbose) {
    std::fprintf(stderr, "%s %dx%d, %lld frames: %d targets from %lld: %s\n", v.codec.c_str(),
                 v.width, v.height, static_cast<long long>(v.frames), n,
                 static_cast<long long>(first), st.ToString().c_str());
  }
  if (st.ok()) FUZZ_CHECK(next == size_t(n), absl::StrCat(next, " of ", n));
  decoder->Close();
  // The audio of the same span: any rate and layout the built-in takes.
  const int rates[] = {8000, 16000, 22050, 44100, 48000};
  const int rate = rates[hash.Range(0, 4)], channels = hash.Range(1, 2);
  const int64_t samples = hash.Range(1, 4000);
  std::vector<float> sound(size_t(channels) * size_t(samples), 1.0f);
  const double t0 = double(targets.front()) * v.time_base_num / v.time_base_den;
  absl::StatusOr<int64_t> got =
      audio->Decode(data, size, t0, samples, rate, channels, sound.data());
  if (verbose) std::fprintf(stderr, "audio: %s\n", got.status().ToString().c_str());
  if (got.ok()) {
    FUZZ_CHECK(*got >= 0 && *got <= samples, absl::StrCat(*got, " of ", samples));
    if (*got == 0) {
      for (float x : sound) FUZZ_CHECK(x == 0.0f, "audio without a stream is not silence");
    }
  } else {
    FUZZ_CHECK(absl::IsDataLoss(got.status()) || absl::IsResourceExhausted(got.status()),
               got.status().ToString());
  }
  return 0;
}
