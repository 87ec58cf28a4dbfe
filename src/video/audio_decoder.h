// The audio of a clip: a video file's audio stream (libavcodec), decoded from shortly before the
// clip's first frame and resampled by libswresample to a given rate and channel count, written
// as planar float32 straight into the batch.
//
// Where a clip's audio lies: sample j of the clip is the file's audio at t0 + j / rate, t0 the
// first frame's presentation time (the container's clock, shared by its streams). Resampling is
// anchored to the file's time 0: the decoder starts feeding the resampler at an input sample
// whose time is a whole number of output samples, so a clip's samples are the samples a
// resampling of the whole stream gives at those times (the same filter phases), whatever the
// seek landed on. Decoding starts 200 ms before t0 (the codec's and the filter's warm-up).
//
// Thread safety: one AudioDecoder per worker thread (a transform's WorkerState).
#ifndef FEEDLINE_SRC_VIDEO_AUDIO_DECODER_H_
#define FEEDLINE_SRC_VIDEO_AUDIO_DECODER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "video/clip_decoder.h"

extern "C" {
struct SwrContext;
}

namespace feedline::video {

class AudioDecoder {
 public:
  AudioDecoder() = default;
  ~AudioDecoder();
  AudioDecoder(const AudioDecoder&) = delete;
  AudioDecoder& operator=(const AudioDecoder&) = delete;

  // The audio of [t0, t0 + n / rate) seconds of the file in [data, data + size), at `rate`
  // samples a second and `channels` (1: mono, 2: stereo; FFmpeg's rematrixing), into `out`
  // ([channels][n], planar). Returns how many of the n positions hold the file's audio; the
  // others are 0 (no audio stream: 0 of n; a clip that runs past the audio's end). kDataLoss
  // naming the cause for a stream that cannot be decoded.
  absl::StatusOr<int64_t> Decode(const uint8_t* data, size_t size, double t0, int64_t n, int rate,
                                 int channels, float* out);

 private:
  void Close();

  MemoryInput input_;
  AVFormatContext* format_ = nullptr;
  AVIOContext* io_ = nullptr;
  AVCodecContext* codec_ = nullptr;
  AVPacket* packet_ = nullptr;
  AVFrame* frame_ = nullptr;
  SwrContext* swr_ = nullptr;
  std::vector<std::vector<float>> converted_;  // one frame's resampled samples, per channel
};

}  // namespace feedline::video

#endif  // FEEDLINE_SRC_VIDEO_AUDIO_DECODER_H_
