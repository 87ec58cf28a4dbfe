// A decoded frame's crop, scaled and converted into a clip's place in the batch (swscale).
//
// Thread safety: one FrameConverter per worker thread (it caches its swscale context).
#ifndef FEEDLINE_SRC_VIDEO_FRAME_CONVERT_H_
#define FEEDLINE_SRC_VIDEO_FRAME_CONVERT_H_

#include <cstdint>

#include "absl/status/status.h"

extern "C" {
struct AVFrame;
struct SwsContext;
}

namespace feedline::video {

// A source rectangle of the frame (whole pixels) and whether the clip is mirrored.
struct Crop {
  int x = 0, y = 0, w = 0, h = 0;
  bool flip = false;
};

class FrameConverter {
 public:
  FrameConverter() = default;
  ~FrameConverter();
  FrameConverter(const FrameConverter&) = delete;
  FrameConverter& operator=(const FrameConverter&) = delete;

  // Scales `crop` of `f` (clamped to the frame, its corner moved onto the chroma grid) to
  // size x size and writes it as three planes R, G, B of size x size bytes at `dst`, mirrored
  // when crop.flip: the crop by offsetting the frame's planes, the conversion straight to
  // planar GBR with bilinear scaling (paletted and bit-packed formats through RGB24 first).
  absl::Status Into(const AVFrame* f, const Crop& crop, int size, uint8_t* dst);

 private:
  SwsContext* sws_ = nullptr;
  AVFrame* rgb_ = nullptr;
};

}  // namespace feedline::video

#endif  // FEEDLINE_SRC_VIDEO_FRAME_CONVERT_H_
