// One video file's clip frames: the container opened from memory (libavformat over the record's
// bytes), its video stream's decoder (libavcodec, one thread), and the frames on screen at given
// presentation timestamps, decoded from the keyframe at or before the first of them.
//
// Thread safety: one ClipDecoder per worker thread (a transform's WorkerState); reused from
// file to file.
#ifndef FEEDLINE_SRC_VIDEO_CLIP_DECODER_H_
#define FEEDLINE_SRC_VIDEO_CLIP_DECODER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"

extern "C" {
struct AVFormatContext;
struct AVIOContext;
struct AVCodecContext;
struct AVFrame;
struct AVPacket;
}

namespace feedline::video {

// A file held in memory, read by libavformat through a custom AVIOContext (Read and Seek are
// its callbacks, `this` their opaque pointer). Also used by the audio decoder.
struct MemoryInput {
  const uint8_t* data = nullptr;
  int64_t size = 0, pos = 0;
  static int Read(void* opaque, uint8_t* buf, int n);
  static int64_t Seek(void* opaque, int64_t offset, int whence);
};

// libavformat over `input` (which must outlive it): the context and its I/O, or an error
// (kDataLoss: not a container FFmpeg reads). The caller closes both (CloseMemoryFormat).
absl::Status OpenMemoryFormat(MemoryInput* input, AVFormatContext** format, AVIOContext** io);
void CloseMemoryFormat(AVFormatContext** format, AVIOContext** io);

// FFmpeg's error text for a return code.
std::string AvError(int rc);

// What a clip is drawn from: the video stream's size, clock and length.
struct VideoInfo {
  int width = 0, height = 0;
  int time_base_num = 1, time_base_den = 1;  // of the stream's timestamps
  int fps_num = 0, fps_den = 1;              // the average frame rate (> 0)
  int64_t start_pts = 0;                     // the stream's first timestamp
  int64_t frames = 0;                        // frames in the stream (estimated; >= 1)
  std::string codec;
};

class ClipDecoder {
 public:
  ClipDecoder();
  ~ClipDecoder();
  ClipDecoder(const ClipDecoder&) = delete;
  ClipDecoder& operator=(const ClipDecoder&) = delete;

  // Opens the file held in [data, data + size) (which must outlive the decoding). kDataLoss
  // naming the cause: not a container FFmpeg reads, no video stream, an unsupported codec,
  // no frame rate or time base, a frame larger than `max_pixels`.
  absl::Status Open(const uint8_t* data, size_t size, int64_t max_pixels);
  const VideoInfo& info() const { return info_; }

  // For each timestamp of `targets` (the stream's time base, ascending), the frame on screen
  // then: the last one whose timestamp is at or before it (the first frame for a time before
  // it; the last frame for times past the end). `emit(i, frame)` is called once per target, in
  // order (consecutive targets on the same frame get frames with the same timestamp). The
  // frame is valid during the call only. kDataLoss for a read or decode error, or no frame at all.
  absl::Status Decode(const std::vector<int64_t>& targets,
                      const std::function<absl::Status(size_t, const AVFrame*)>& emit);

  void Close();

 private:
  // One pass from the keyframe at or before the first target, or (from_start) from the file as
  // just opened; `retry` set when the seek failed, landed after the first target, or where
  // nothing decodes.
  absl::Status DecodeFrom(bool from_start, const std::vector<int64_t>& targets,
                          const std::function<absl::Status(size_t, const AVFrame*)>& emit,
                          bool* retry);
  MemoryInput input_;
  AVFormatContext* format_ = nullptr;
  AVIOContext* io_ = nullptr;
  AVCodecContext* codec_ = nullptr;
  AVPacket* packet_ = nullptr;
  AVFrame* frame_ = nullptr;
  AVFrame* shown_ = nullptr;  // the last frame decoded (on screen until the next)
  int stream_ = -1;
  int64_t max_pixels_ = 0;
  VideoInfo info_;
};

}  // namespace feedline::video

#endif  // FEEDLINE_SRC_VIDEO_CLIP_DECODER_H_
