#include "video/clip_decoder.h"

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/avutil.h>
#include <libavutil/log.h>
#include <libavutil/mathematics.h>
#include <libavutil/mem.h>
}

namespace feedline::video {
namespace {

constexpr int kIoBuffer = 64 << 10;
// Frames a clip may decode past its first target's keyframe before the file is judged broken:
// a keyframe interval longer than this is beyond any file a training set holds (10 minutes at
// 30 frames a second).
constexpr int64_t kMaxFramesDecoded = 18000;
// Packets read ahead of the decoder, past the first one after a clip's last target: B-frames
// come in decode order after a later frame, at most the stream's reorder delay (has_b_frames)
// later; this margin beyond it covers a stream that under-reports it.
constexpr int kReorderMargin = 16;
// At most this many (a clip far from its keyframe decodes the rest as it reads: a frame left
// past the read-ahead is decoded, so the choice stays exact, only less is skipped).
constexpr size_t kMaxAhead = 1024;

// The packets read ahead (owned).
struct PacketQueue {
  std::vector<AVPacket*> packets;
  ~PacketQueue() {
    for (AVPacket* p : packets) av_packet_free(&p);
  }
};

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("video: ", what));
}

// The largest block FFmpeg may allocate at once (av_max_alloc, for the process). A container's
// header claims table sizes (an MP4 atom's sample count) that FFmpeg allocates before reading
// them: a 3.8 KB file with one bit changed asked for 512 MB. No real file needs a block this
// large (an 8K frame is 50 MB, the sample table of ten million frames 40 MB); past it the open
// fails as the file's error.
constexpr size_t kMaxFfmpegBlock = size_t{256} << 20;

// Whether this thread decodes for feedline (a map worker, or any thread that made a
// ClipDecoder).
thread_local bool t_decoder_thread = false;

// FFmpeg's log callback for the process. A message from feedline's decoder threads is dropped:
// what matters comes back as the sample's error. Others go where FFmpeg's default sends them
// (stderr, at av_log_get_level()). Installed rather than left to whoever set one: PyAV's
// forwards every message to Python's logging, taking the GIL from the decoder threads — the
// trainer's lock, and a thread that asks for it while the interpreter exits is unwound and
// aborts the process.
void Log(void* avcl, int level, const char* fmt, va_list args) {
  if (t_decoder_thread) return;
  av_log_default_callback(avcl, level, fmt, args);
}

}  // namespace

std::string AvError(int rc) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {0};
  av_strerror(rc, text, sizeof(text));
  return text;
}

absl::Status OpenMemoryFormat(MemoryInput* input, AVFormatContext** format, AVIOContext** io) {
  // Each time: a library imported later (PyAV) may have put its own in place meanwhile.
  t_decoder_thread = true;
  av_log_set_callback(&Log);
  av_max_alloc(kMaxFfmpegBlock);
  auto* buffer = static_cast<uint8_t*>(av_malloc(kIoBuffer));
  if (buffer == nullptr) return absl::ResourceExhaustedError("video: out of memory");
  *io = avio_alloc_context(buffer, kIoBuffer, 0, input, &MemoryInput::Read, nullptr,
                           &MemoryInput::Seek);
  if (*io == nullptr) {
    av_free(buffer);
    return absl::ResourceExhaustedError("video: out of memory");
  }
  *format = avformat_alloc_context();
  if (*format == nullptr) return absl::ResourceExhaustedError("video: out of memory");
  (*format)->pb = *io;
  (*format)->flags |= AVFMT_FLAG_CUSTOM_IO;
  if (int rc = avformat_open_input(format, nullptr, nullptr, nullptr); rc < 0) {
    // *format is freed by a failed open.
    return Bad(absl::StrCat("not a video container FFmpeg can read (", AvError(rc), ")"));
  }
  return absl::OkStatus();
}

void CloseMemoryFormat(AVFormatContext** format, AVIOContext** io) {
  if (*format != nullptr) avformat_close_input(format);
  if (*io != nullptr) {
    av_freep(&(*io)->buffer);
    avio_context_free(io);
  }
}

ClipDecoder::ClipDecoder() { t_decoder_thread = true; }
ClipDecoder::~ClipDecoder() {
  Close();
  av_packet_free(&packet_);
  av_frame_free(&frame_);
  av_frame_free(&shown_);
}

void ClipDecoder::Close() {
  avcodec_free_context(&codec_);
  CloseMemoryFormat(&format_, &io_);
  stream_ = -1;
  info_ = VideoInfo();
}

int MemoryInput::Read(void* opaque, uint8_t* buf, int n) {
  auto* in = static_cast<MemoryInput*>(opaque);
  const int64_t left = in->size - in->pos;
  if (left <= 0 || n <= 0) return AVERROR_EOF;
  const int k = int(std::min<int64_t>(n, left));
  std::memcpy(buf, in->data + in->pos, size_t(k));
  in->pos += k;
  return k;
}

int64_t MemoryInput::Seek(void* opaque, int64_t offset, int whence) {
  auto* in = static_cast<MemoryInput*>(opaque);
  whence &= ~AVSEEK_FORCE;
  if (whence == AVSEEK_SIZE) return in->size;
  const int64_t base = whence == SEEK_SET   ? 0
                       : whence == SEEK_CUR ? in->pos
                       : whence == SEEK_END ? in->size
                                            : -1;
  if (base < 0) return AVERROR(EINVAL);
  if ((offset > 0 && base > INT64_MAX - offset) || (offset < 0 && base + offset < 0)) {
    return AVERROR(EINVAL);
  }
  const int64_t to = base + offset;
  if (to > in->size) return AVERROR(EINVAL);
  in->pos = to;
  return to;
}

absl::Status ClipDecoder::Open(const uint8_t* data, size_t size, int64_t max_pixels) {
  Close();
  max_pixels_ = max_pixels;
  if (size == 0) return Bad("an empty file");
  input_ = MemoryInput{data, int64_t(size), 0};
  if (absl::Status s = OpenMemoryFormat(&input_, &format_, &io_); !s.ok()) return s;
  const AVCodec* codec = nullptr;
  stream_ = av_find_best_stream(format_, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
  if (stream_ < 0) {
    // Containers whose header does not say (MPEG-TS, raw streams): probe their packets.
    if (avformat_find_stream_info(format_, nullptr) >= 0) {
      stream_ = av_find_best_stream(format_, AVMEDIA_TYPE_VIDEO, -1, -1, &codec, 0);
    }
  }
  if (stream_ == AVERROR_DECODER_NOT_FOUND) {
    const int any = av_find_best_stream(format_, AVMEDIA_TYPE_VIDEO, -1, -1, nullptr, 0);
    return Bad(absl::StrCat(
        "no decoder for its video codec (",
        any >= 0 ? avcodec_get_name(format_->streams[any]->codecpar->codec_id) : "unknown", ")"));
  }
  if (stream_ < 0 || codec == nullptr) return Bad("no video stream");
  AVStream* st = format_->streams[stream_];
  if (st->codecpar->width <= 0 || st->codecpar->height <= 0) {
    avformat_find_stream_info(format_, nullptr);  // the size from the first frames
  }
  const int64_t w = st->codecpar->width, h = st->codecpar->height;
  if (w <= 0 || h <= 0) return Bad("a video stream without a frame size");
  if (w * h > max_pixels) {
    return Bad(absl::StrCat("frames of ", w, " x ", h, " pixels, above max_image_pixels (",
                            max_pixels, ")"));
  }
  if (st->time_base.num <= 0 || st->time_base.den <= 0) return Bad("no time base");
  AVRational fps = st->avg_frame_rate;
  if (fps.num <= 0 || fps.den <= 0) fps = st->r_frame_rate;
  if (fps.num <= 0 || fps.den <= 0) fps = av_guess_frame_rate(format_, st, nullptr);
  if (fps.num <= 0 || fps.den <= 0) {
    // Formats without a nominal rate (animated GIF: each frame its own delay): FFmpeg's own
    // assumption for a stream that says nothing, 25 a second; frame times come from the
    // timestamps anyway, this only spaces a clip's frame_step.
    fps = AVRational{25, 1};
  }
  if (av_q2d(fps) > 10000 || av_q2d(fps) < 1e-3) return Bad("no usable frame rate");
  codec_ = avcodec_alloc_context3(codec);
  if (codec_ == nullptr) return absl::ResourceExhaustedError("video: out of memory");
  if (int rc = avcodec_parameters_to_context(codec_, st->codecpar); rc < 0) {
    return Bad(absl::StrCat("codec parameters (", AvError(rc), ")"));
  }
  codec_->thread_count = 1;  // the engine's workers decode clips side by side
  codec_->pkt_timebase = st->time_base;
  if (int rc = avcodec_open2(codec_, codec, nullptr); rc < 0) {
    return Bad(absl::StrCat("cannot open the ", codec->name, " decoder (", AvError(rc), ")"));
  }
  info_.width = int(w);
  info_.height = int(h);
  info_.time_base_num = st->time_base.num;
  info_.time_base_den = st->time_base.den;
  info_.fps_num = fps.num;
  info_.fps_den = fps.den;
  info_.start_pts = st->start_time != AV_NOPTS_VALUE ? st->start_time : 0;
  info_.codec = codec->name;
  // Frames: from the duration at the average rate (what a clip's start is drawn over), at most
  // what the container counts.
  int64_t duration = st->duration;
  if (duration == AV_NOPTS_VALUE || duration <= 0) {
    duration = format_->duration != AV_NOPTS_VALUE
                   ? av_rescale_q(format_->duration, AV_TIME_BASE_Q, st->time_base)
                   : 0;
  }
  // Frames that start before the end: the duration in frame periods, rounded down.
  int64_t frames =
      duration > 0 ? av_rescale_q_rnd(duration, st->time_base, av_inv_q(fps), AV_ROUND_DOWN) : 0;
  if (st->nb_frames > 0 && (frames <= 0 || st->nb_frames < frames)) frames = st->nb_frames;
  info_.frames = std::clamp<int64_t>(frames, 1, int64_t{1} << 40);
  if (packet_ == nullptr) packet_ = av_packet_alloc();
  if (frame_ == nullptr) frame_ = av_frame_alloc();
  if (shown_ == nullptr) shown_ = av_frame_alloc();
  if (packet_ == nullptr || frame_ == nullptr || shown_ == nullptr) {
    return absl::ResourceExhaustedError("video: out of memory");
  }
  return absl::OkStatus();
}

absl::Status ClipDecoder::Decode(const std::vector<int64_t>& targets,
                                 const std::function<absl::Status(size_t, const AVFrame*)>& emit) {
  if (codec_ == nullptr) return absl::FailedPreconditionError("video: no file open");
  if (targets.empty()) return absl::OkStatus();
  bool retry = false;
  // From the keyframe at or before the first target; if the container's index puts it after
  // (a broken index, an open GOP whose leading frames come out later), from the start.
  const bool seek = targets.front() > info_.start_pts;
  absl::Status st = DecodeFrom(!seek, targets, emit, &retry);
  if (st.ok() && retry) {
    // From the start: opened afresh (a demuxer's state after a seek that missed — MPEG-TS
    // positions by bytes — is not the start), then every frame in order.
    const MemoryInput input = input_;
    if (st = Open(input.data, size_t(input.size), max_pixels_); st.ok()) {
      st = DecodeFrom(true, targets, emit, &retry);
    }
  }
  return st;
}

absl::Status ClipDecoder::DecodeFrom(
    bool from_start, const std::vector<int64_t>& targets,
    const std::function<absl::Status(size_t, const AVFrame*)>& emit, bool* retry) {
  *retry = false;
  // From the start: the file as opened, nothing read yet. Else the keyframe at or before the
  // first target.
  if (!from_start) {
    if (av_seek_frame(format_, stream_, targets.front(), AVSEEK_FLAG_BACKWARD) < 0) {
      *retry = true;
      return absl::OkStatus();
    }
  }
  avcodec_flush_buffers(codec_);
  av_frame_unref(shown_);
  int rc = 0;
  bool have_shown = false;
  size_t next = 0;
  int64_t decoded = 0;
  // A frame came out of the decoder: the targets before it show the previous frame.
  auto on_frame = [&](AVFrame* f) -> absl::Status {
    int64_t pts = f->pts != AV_NOPTS_VALUE ? f->pts : f->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) return Bad("a frame without a timestamp");
    if (++decoded > kMaxFramesDecoded) {
      return Bad(absl::StrCat("more than ", kMaxFramesDecoded,
                              " frames decoded for one clip (a broken index?)"));
    }
    while (next < targets.size() && targets[next] < pts) {
      if (!have_shown) {
        if (!from_start) {  // the seek went past the clip's first frame
          *retry = true;
          return absl::OkStatus();
        }
        // A time before the first frame: the first frame.
        if (absl::Status s = emit(next, f); !s.ok()) return s;
      } else if (absl::Status s = emit(next, shown_); !s.ok()) {
        return s;
      }
      ++next;
    }
    av_frame_unref(shown_);
    av_frame_move_ref(shown_, f);
    have_shown = true;
    return absl::OkStatus();
  };
  auto drain = [&]() -> absl::Status {
    for (;;) {
      rc = avcodec_receive_frame(codec_, frame_);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return absl::OkStatus();
      if (rc < 0) return Bad(absl::StrCat("corrupt video data (", AvError(rc), ")"));
      if (absl::Status s = on_frame(frame_); !s.ok() || *retry) return s;
    }
  };
  auto send = [&](AVPacket* p) -> absl::Status {
    rc = avcodec_send_packet(codec_, p);
    av_packet_unref(p);
    if (rc < 0 && rc != AVERROR(EAGAIN)) {
      return Bad(absl::StrCat("corrupt video data (", AvError(rc), ")"));
    }
    return drain();
  };
  auto read_error = [&](int code) {
    return Bad(
        absl::StrCat("the file ends or breaks off before the clip's frames (", AvError(code), ")"));
  };
  // Decode only the frames the clip shows: the packets from the keyframe to a little past the
  // clip's last time are read first; their timestamps say which frame each target shows (the
  // last at or before it), and a frame no target shows is not decoded when nothing refers to
  // it (skip_frame: a non-reference B-frame, most of those frame_step passes over). Frames
  // others refer to are decoded whatever their time. Without every timestamp: all decoded.
  PacketQueue ahead;
  bool timed = true, ended = false;
  int broke = 0;  // the read's error, when it broke off
  const int64_t last = targets.back();
  const size_t margin = size_t(std::max(codec_->has_b_frames, 0) + kReorderMargin);
  size_t past = SIZE_MAX;  // the first packet after the last target, in decode order
  while (ahead.packets.size() < kMaxAhead &&
         (past == SIZE_MAX || ahead.packets.size() < past + margin)) {
    rc = av_read_frame(format_, packet_);
    if (rc < 0) {  // the end, or a break: said once the packets before it are decoded
      if (rc == AVERROR_EOF) {
        ended = true;
      } else {
        broke = rc;
      }
      break;
    }
    if (packet_->stream_index != stream_) {
      av_packet_unref(packet_);
      continue;
    }
    if (packet_->pts == AV_NOPTS_VALUE) timed = false;
    if (past == SIZE_MAX && packet_->pts != AV_NOPTS_VALUE && packet_->pts > last) {
      past = ahead.packets.size();
    }
    AVPacket* p = av_packet_alloc();
    if (p == nullptr) return absl::ResourceExhaustedError("video: out of memory");
    av_packet_move_ref(p, packet_);
    ahead.packets.push_back(p);
  }
  std::vector<int64_t> times, shown;  // the packets' times, sorted; those the targets show
  if (timed) {
    for (const AVPacket* p : ahead.packets) times.push_back(p->pts);
    std::sort(times.begin(), times.end());
  }
  if (!times.empty()) {
    for (const int64_t t : targets) {
      auto at = std::upper_bound(times.begin(), times.end(), t);
      shown.push_back(at == times.begin() ? times.front() : *(at - 1));
    }
    std::sort(shown.begin(), shown.end());
  }
  for (AVPacket* p : ahead.packets) {
    if (next >= targets.size()) break;
    const bool needed = shown.empty() || std::binary_search(shown.begin(), shown.end(), p->pts);
    codec_->skip_frame = needed ? AVDISCARD_DEFAULT : AVDISCARD_NONREF;
    absl::Status s = send(p);
    codec_->skip_frame = AVDISCARD_DEFAULT;
    if (!s.ok() || *retry) return s;
  }
  if (broke != 0 && next < targets.size()) return read_error(broke);
  while (!ended && broke == 0 && next < targets.size()) {  // (past the read-ahead bound)
    rc = av_read_frame(format_, packet_);
    if (rc == AVERROR_EOF) break;
    if (rc < 0) return read_error(rc);
    if (packet_->stream_index != stream_) {
      av_packet_unref(packet_);
      continue;
    }
    if (absl::Status s = send(packet_); !s.ok() || *retry) return s;
  }
  if (next < targets.size()) {  // the end of the stream: what the decoder still holds
    avcodec_send_packet(codec_, nullptr);
    if (absl::Status s = drain(); !s.ok() || *retry) return s;
    if (!have_shown && !from_start) {  // the seek landed where nothing decodes (no keyframe)
      *retry = true;
      return absl::OkStatus();
    }
    if (!have_shown) return Bad("no frame could be decoded");
    for (; next < targets.size(); ++next) {  // past the end: the last frame
      if (absl::Status s = emit(next, shown_); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace feedline::video
