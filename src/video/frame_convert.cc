#include "video/frame_convert.h"

#include <algorithm>
#include <cstddef>

extern "C" {
#include <libavutil/frame.h>
#include <libavutil/pixdesc.h>
#include <libswscale/swscale.h>
}

namespace feedline::video {

FrameConverter::~FrameConverter() {
  sws_freeContext(sws_);
  av_frame_free(&rgb_);
}

absl::Status FrameConverter::Into(const AVFrame* f, const Crop& crop, int size, uint8_t* dst) {
  const auto format = AVPixelFormat(f->format);
  const AVPixFmtDescriptor* d = av_pix_fmt_desc_get(format);
  if (d == nullptr || f->width <= 0 || f->height <= 0) {
    return absl::DataLossError("video: a frame of an unknown pixel format");
  }
  const AVFrame* src = f;
  AVPixelFormat src_format = format;
  // Paletted or bit-packed frames cannot be cropped by offsetting their planes: converted
  // whole to RGB24 first.
  if ((d->flags & (AV_PIX_FMT_FLAG_PAL | AV_PIX_FMT_FLAG_BITSTREAM | AV_PIX_FMT_FLAG_HWACCEL)) !=
      0) {
    if (rgb_ == nullptr) rgb_ = av_frame_alloc();
    if (rgb_ == nullptr) return absl::ResourceExhaustedError("video: out of memory");
    if (rgb_->width != f->width || rgb_->height != f->height) {
      av_frame_unref(rgb_);
      rgb_->format = AV_PIX_FMT_RGB24;
      rgb_->width = f->width;
      rgb_->height = f->height;
      if (av_frame_get_buffer(rgb_, 0) < 0) {
        return absl::ResourceExhaustedError("video: out of memory");
      }
    }
    sws_ = sws_getCachedContext(sws_, f->width, f->height, format, f->width, f->height,
                                AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr);
    if (sws_ == nullptr) return absl::DataLossError("video: a pixel format swscale cannot read");
    if (sws_scale(sws_, f->data, f->linesize, 0, f->height, rgb_->data, rgb_->linesize) < 0) {
      return absl::DataLossError("video: a frame swscale cannot convert");
    }
    src = rgb_;
    src_format = AV_PIX_FMT_RGB24;
    d = av_pix_fmt_desc_get(src_format);
  }
  // The crop within this frame (its size may differ from the stream's), on the chroma grid.
  int x = std::clamp(crop.x, 0, src->width - 1), y = std::clamp(crop.y, 0, src->height - 1);
  x &= ~((1 << d->log2_chroma_w) - 1);
  y &= ~((1 << d->log2_chroma_h) - 1);
  const int w = std::clamp(crop.w + (crop.x - x), 1, src->width - x);
  const int h = std::clamp(crop.h + (crop.y - y), 1, src->height - y);
  const uint8_t* planes[4] = {nullptr, nullptr, nullptr, nullptr};
  for (int p = 0; p < 4 && src->data[p] != nullptr; ++p) {
    int step = 0;
    for (int c = 0; c < d->nb_components; ++c) {
      if (d->comp[c].plane == p) step = std::max(step, d->comp[c].step);
    }
    const bool chroma = (p == 1 || p == 2) && (d->flags & AV_PIX_FMT_FLAG_RGB) == 0;
    const int hs = chroma ? d->log2_chroma_w : 0, vs = chroma ? d->log2_chroma_h : 0;
    planes[p] = src->data[p] + ptrdiff_t(y >> vs) * src->linesize[p] + ptrdiff_t(x >> hs) * step;
  }
  const int n = size;
  sws_ = sws_getCachedContext(sws_, w, h, src_format, n, n, AV_PIX_FMT_GBRP, SWS_BILINEAR, nullptr,
                              nullptr, nullptr);
  if (sws_ == nullptr) return absl::DataLossError("video: a pixel format swscale cannot read");
  const size_t plane = size_t(n) * size_t(n);
  uint8_t* out[4] = {dst + plane, dst + 2 * plane, dst, nullptr};  // G, B, R
  const int out_stride[4] = {n, n, n, 0};
  if (size <= 0) return absl::InvalidArgumentError("video: the output size must be >= 1");
  if (sws_scale(sws_, planes, src->linesize, 0, h, out, out_stride) < 0) {
    return absl::DataLossError("video: a frame swscale cannot convert");
  }
  if (crop.flip) {
    for (size_t r = 0; r < size_t(3 * n); ++r) {
      std::reverse(dst + r * size_t(n), dst + (r + 1) * size_t(n));
    }
  }
  return absl::OkStatus();
}

}  // namespace feedline::video
