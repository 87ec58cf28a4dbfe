#include "video/audio_decoder.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/channel_layout.h>
#include <libavutil/mathematics.h>
#include <libavutil/samplefmt.h>
#include <libswresample/swresample.h>
}

namespace feedline::video {
namespace {

constexpr double kWarmUpS = 0.2;  // decoded before t0: the codec's and the filter's history
constexpr double kMaxSeconds = 1e9;                    // ~30 years: any real file's times are below
constexpr int64_t kMaxSampleIndex = int64_t{1} << 52;  // ditto, in samples
constexpr int kMaxInputRate = 1 << 22;  // 4 MHz: beyond any audio codec's (and 1 kHz below)
// Audio frames one clip may decode before the file is judged broken (a seek that failed on a
// long file decodes from the start: 20 minutes of 1024-sample frames at 44.1 kHz).
constexpr int64_t kMaxFramesDecoded = 52000;

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("video: audio: ", what));
}

// x mod m in [0, m), for negative x too.
int64_t Mod(int64_t x, int64_t m) { return ((x % m) + m) % m; }

}  // namespace

AudioDecoder::~AudioDecoder() {
  Close();
  av_packet_free(&packet_);
  av_frame_free(&frame_);
}

void AudioDecoder::Close() {
  swr_free(&swr_);
  avcodec_free_context(&codec_);
  CloseMemoryFormat(&format_, &io_);
}

absl::StatusOr<int64_t> AudioDecoder::Decode(const uint8_t* data, size_t size, double t0, int64_t n,
                                             int rate, int channels, float* out) {
  Close();
  std::fill_n(out, size_t(n) * size_t(channels), 0.0f);
  if (size == 0 || n <= 0) return int64_t{0};
  // A clip's start beyond any real file (a container's timestamps can claim anything): no
  // sample index or seek target is computed from it.
  if (!(std::abs(t0) < kMaxSeconds)) return Bad("the clip's time is out of range");
  input_ = MemoryInput{data, int64_t(size), 0};
  if (absl::Status s = OpenMemoryFormat(&input_, &format_, &io_); !s.ok()) return s;
  const AVCodec* codec = nullptr;
  int stream = av_find_best_stream(format_, AVMEDIA_TYPE_AUDIO, -1, -1, &codec, 0);
  if (stream < 0 && stream != AVERROR_DECODER_NOT_FOUND &&
      avformat_find_stream_info(format_, nullptr) >= 0) {  // headers that do not say (MPEG-TS)
    stream = av_find_best_stream(format_, AVMEDIA_TYPE_AUDIO, -1, -1, &codec, 0);
  }
  if (stream == AVERROR_DECODER_NOT_FOUND) {
    const int any = av_find_best_stream(format_, AVMEDIA_TYPE_AUDIO, -1, -1, nullptr, 0);
    return Bad(absl::StrCat(
        "no decoder for its audio codec (",
        any >= 0 ? avcodec_get_name(format_->streams[any]->codecpar->codec_id) : "unknown", ")"));
  }
  if (stream < 0 || codec == nullptr) return int64_t{0};  // no audio: silence
  AVStream* st = format_->streams[stream];
  if (st->time_base.num <= 0 || st->time_base.den <= 0) return Bad("no time base");
  codec_ = avcodec_alloc_context3(codec);
  if (codec_ == nullptr) return absl::ResourceExhaustedError("video: out of memory");
  if (int rc = avcodec_parameters_to_context(codec_, st->codecpar); rc < 0) {
    return Bad(absl::StrCat("codec parameters (", AvError(rc), ")"));
  }
  codec_->thread_count = 1;
  codec_->pkt_timebase = st->time_base;
  if (int rc = avcodec_open2(codec_, codec, nullptr); rc < 0) {
    return Bad(absl::StrCat("cannot open the ", codec->name, " decoder (", AvError(rc), ")"));
  }
  if (packet_ == nullptr) packet_ = av_packet_alloc();
  if (frame_ == nullptr) frame_ = av_frame_alloc();
  if (packet_ == nullptr || frame_ == nullptr) {
    return absl::ResourceExhaustedError("video: out of memory");
  }
  // From the packet at or before the warm-up's start (from the file's start if that fails).
  const int64_t from = int64_t(std::floor((t0 - kWarmUpS) / av_q2d(st->time_base)));
  const int64_t start = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
  if (from > start) av_seek_frame(format_, stream, from, AVSEEK_FLAG_BACKWARD);

  const int64_t first = std::llround(t0 * rate);  // the clip's first sample, on the file's clock
  int64_t have = 0;                               // positions written
  int64_t next_out = 0;  // the resampler's next output sample, on the file's clock
  int in_rate = 0, in_format = -1;
  AVChannelLayout in_layout{};
  int64_t skip = 0;  // input samples to drop before the first fed one (phase alignment)
  bool started = false, done = false;
  int64_t decoded = 0;

  // Resampled samples [0, k) of converted_, the file's samples next_out.., into the clip.
  auto place = [&](int k) {
    for (int i = 0; i < k; ++i) {
      const int64_t j = next_out + i - first;
      if (j < 0 || j >= n) continue;
      for (int c = 0; c < channels; ++c) out[size_t(c) * size_t(n) + size_t(j)] = converted_[c][i];
      ++have;
    }
    next_out += k;
    if (next_out >= first + n) done = true;
  };
  auto convert = [&](const uint8_t** in, int count) -> absl::Status {
    const int cap = swr_get_out_samples(swr_, count);
    if (cap < 0) return Bad("the resampler failed");
    for (auto& ch : converted_) ch.resize(size_t(std::max(cap, 1)));
    uint8_t* dst[2] = {reinterpret_cast<uint8_t*>(converted_[0].data()),
                       channels > 1 ? reinterpret_cast<uint8_t*>(converted_[1].data()) : nullptr};
    const int k = swr_convert(swr_, dst, cap, in, count);
    if (k < 0) return Bad(absl::StrCat("the resampler failed (", AvError(k), ")"));
    place(k);
    return absl::OkStatus();
  };
  auto on_frame = [&](AVFrame* f) -> absl::Status {
    if (++decoded > kMaxFramesDecoded) {
      return Bad(absl::StrCat("more than ", kMaxFramesDecoded, " frames decoded for one clip"));
    }
    if (f->sample_rate <= 0 || f->nb_samples <= 0 || f->ch_layout.nb_channels <= 0) {
      return absl::OkStatus();
    }
    int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
    if (!started) {
      if (pts == AV_NOPTS_VALUE) return Bad("a frame without a timestamp");
      if (f->sample_rate < 1000 || f->sample_rate > kMaxInputRate) {
        return Bad(absl::StrCat("a sample rate of ", f->sample_rate, " Hz"));
      }
      in_rate = f->sample_rate;
      in_format = f->format;
      if (int rc = av_channel_layout_copy(&in_layout, &f->ch_layout); rc < 0) {
        return absl::ResourceExhaustedError("video: out of memory");
      }
      AVChannelLayout out_layout{};
      av_channel_layout_default(&out_layout, channels);
      const int rc = swr_alloc_set_opts2(&swr_, &out_layout, AV_SAMPLE_FMT_FLTP, rate, &in_layout,
                                         AVSampleFormat(in_format), in_rate, 0, nullptr);
      av_channel_layout_uninit(&out_layout);
      if (rc < 0 || swr_init(swr_) < 0) {
        return Bad(absl::StrCat("cannot resample ", in_rate, " Hz ",
                                av_get_sample_fmt_name(AVSampleFormat(in_format)), " to ", rate,
                                " Hz"));
      }
      converted_.assign(size_t(channels), {});
      // The first input sample fed is the first at or after this frame's start whose time is
      // a whole number of output samples: a multiple of in_rate / gcd(in_rate, rate).
      const int64_t s0 = av_rescale_q(pts, st->time_base, AVRational{1, in_rate});
      if (s0 < -kMaxSampleIndex || s0 > kMaxSampleIndex) return Bad("timestamps out of range");
      const int64_t period = in_rate / std::gcd(int64_t(in_rate), int64_t(rate));
      skip = Mod(-s0, period);
      next_out = (s0 + skip) / period * (rate / std::gcd(int64_t(in_rate), int64_t(rate)));
      started = true;
    } else if (f->sample_rate != in_rate || f->format != in_format ||
               av_channel_layout_compare(&f->ch_layout, &in_layout) != 0) {
      return Bad("the audio format changes mid-stream");
    }
    int offset = 0;
    if (skip > 0) {
      const int64_t drop = std::min<int64_t>(skip, f->nb_samples);
      skip -= drop;
      offset = int(drop);
      if (offset == f->nb_samples) return absl::OkStatus();
    }
    const int bytes = av_get_bytes_per_sample(AVSampleFormat(in_format));
    const bool planar = av_sample_fmt_is_planar(AVSampleFormat(in_format));
    const int planes = planar ? f->ch_layout.nb_channels : 1;
    std::vector<const uint8_t*> in(static_cast<size_t>(planes), nullptr);
    for (int p = 0; p < planes; ++p) {
      in[size_t(p)] = f->extended_data[p] + size_t(offset) * size_t(bytes) *
                                                size_t(planar ? 1 : f->ch_layout.nb_channels);
    }
    return convert(in.data(), f->nb_samples - offset);
  };
  auto drain = [&]() -> absl::Status {
    for (;;) {
      const int rc = avcodec_receive_frame(codec_, frame_);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return absl::OkStatus();
      if (rc < 0) return Bad(absl::StrCat("corrupt audio data (", AvError(rc), ")"));
      absl::Status s = on_frame(frame_);
      av_frame_unref(frame_);
      if (!s.ok() || done) return s;
    }
  };
  absl::Status status;
  while (!done && status.ok()) {
    const int rc = av_read_frame(format_, packet_);
    if (rc == AVERROR_EOF) break;
    if (rc < 0) {
      status = Bad(absl::StrCat("the file breaks off (", AvError(rc), ")"));
      break;
    }
    if (packet_->stream_index != stream) {
      av_packet_unref(packet_);
      continue;
    }
    const int sent = avcodec_send_packet(codec_, packet_);
    av_packet_unref(packet_);
    if (sent < 0 && sent != AVERROR(EAGAIN)) {
      status = Bad(absl::StrCat("corrupt audio data (", AvError(sent), ")"));
      break;
    }
    status = drain();
  }
  if (status.ok() && !done) {  // the end: what the decoder and the resampler still hold
    avcodec_send_packet(codec_, nullptr);
    status = drain();
    if (status.ok() && !done && started) status = convert(nullptr, 0);
  }
  av_channel_layout_uninit(&in_layout);
  Close();
  if (!status.ok()) return status;
  return have;
}

}  // namespace feedline::video
