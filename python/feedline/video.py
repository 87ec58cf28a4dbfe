"""feedline.VideoLoader: clips of frames decoded by FFmpeg's libraries in feedline's threads."""

import os

from . import _feedline
from ._epoch import _FieldsIterator, _start_epoch
from ._util import (_LoaderFace, _check_type, _default_seed, _engine_args, _is_url, _options_doc,
                    _pair, _parse_bytes, _parse_count, _shown, _timeout)


class VideoLoader(_LoaderFace):
    """Batches of video clips: (clips, labels), clips uint8 [B, T, 3, size, size] (T =
    clip_len), labels int64 [B].

    source: a folder with one sub-folder of videos per class (.mp4, .mkv, .webm, .avi, .mov,
        ...; torchvision's ImageFolder order), a list file of "path label" lines (paths or
        http(s)/s3 URLs), or WebDataset shards (a .tar or a "{000..009}" pattern; a sample per
        key: its member with a video extension, its .cls label).
    clip_len: frames per clip. frame_step: frames of the stream between two of the clip's
        frames; or fps: that many frames a second, taken by timestamps (right for
        variable-frame-rate files). The frame at time t is the one on screen then: the last
        frame whose presentation timestamp is at or before t, so frames are exact for files
        with B-frames, variable frame rates and edit lists. A clip longer than the video
        repeats its last frame.
    transform: "train" (the clip's start drawn from the seed, epoch and index among the
        frames where it fits; one RandomResizedCrop box (scale, ratio) and flip for all of its
        frames) or "eval" (the middle clip; the shorter side resized to resize_size, the
        centre size x size).
    clips_per_video: clips of each video an epoch (K): sample i is clip i % K of video i // K
        (return_index gives i), shuffled and split over ranks like any sample; len() counts
        clips. clip_starts: "random" (drawn per clip) or "uniform" (clip k at (2k + 1) / 2K of
        the frames where a clip fits: the usual multi-clip evaluation); None: random for
        train, uniform for eval.
    audio_rate: also the clip's audio, resampled to this many samples a second by FFmpeg
        (libswresample), audio_channels 1 (mono) or 2: batches are then dicts {"clips",
        "audio" float32 [B, audio_channels, S], "audio_samples" int64 [B] (how many of the S
        hold the file's audio: the rest are 0, for a file without audio or a clip past its
        end), "label"} (+ "index"). Sample j is the audio at the clip's first frame's time plus
        j / audio_rate; S = audio_rate * audio_seconds, audio_seconds by default the clip's
        span clip_len / fps (with frame_step, give audio_seconds: the span depends on each
        file's frame rate).
    Only the frames a clip needs are decoded: a seek to the keyframe before its first frame,
    then forward to its last; the sampled frames are scaled and converted straight into the
    batch. A file FFmpeg cannot read, a corrupt packet, no video stream or frames larger than
    max_image_pixels raise DataError naming the file (on_error="skip" replaces it).
    shuffle/seed/rank/world_size/state_dict/stats and the engine's options as for ImageLoader.
    """

    def __init__(self, source, clip_len=16, frame_step=1, fps=None, clips_per_video=1,
                 clip_starts=None, audio_rate=None, audio_channels=1, audio_seconds=None,
                 batch_size=8,
                 shuffle=True, seed=None, drop_last=False, transform="train", size=112,
                 resize_size=128, scale=(0.08, 1.0), ratio=(3.0 / 4.0, 4.0 / 3.0), flip=True,
                 workers="auto", prefetch="auto", io_depth="auto", memory_budget="auto",
                 on_error="raise", max_errors=None, rank=None, world_size=None,
                 read_timeout=60.0, max_image_pixels=178956970, max_record_bytes=268435456,
                 return_index=False, worker_nice=19, epoch_head_start=True, even_shards=True):
        self._args = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        seed = _default_seed() if seed is None else seed
        source = os.fspath(_check_type("source", source, (str, bytes, os.PathLike),
                                       "a folder of videos or a list file"))
        if isinstance(source, bytes):
            source = os.fsdecode(source)
        if "{" not in source and not _is_url(source) and not os.path.exists(source):
            raise FileNotFoundError(f"source: {source}: no such file or directory")
        _check_type("clip_len", clip_len, int, "an int")
        _check_type("frame_step", frame_step, int, "an int")
        if fps is not None:
            _check_type("fps", fps, (int, float), "a number")
            if not fps > 0:
                raise ValueError(f"fps: must be > 0 (or None: frame_step), got {fps!r}")
        _check_type("clips_per_video", clips_per_video, int, "an int")
        if clip_starts is not None:
            _check_type("clip_starts", clip_starts, str, "'random', 'uniform' or None")
            if clip_starts not in ("random", "uniform"):
                raise ValueError("clip_starts: must be 'random', 'uniform' or None, got "
                                 f"{clip_starts!r}")
        if audio_rate is not None:
            _check_type("audio_rate", audio_rate, int, "an int (samples a second) or None")
        _check_type("audio_channels", audio_channels, int, "1 or 2")
        if audio_seconds is not None:
            _check_type("audio_seconds", audio_seconds, (int, float), "seconds, or None")
            if not audio_seconds > 0:
                raise ValueError(f"audio_seconds: must be > 0 (or None), got {audio_seconds!r}")
        _check_type("transform", transform, str, "'train' or 'eval'")
        _check_type("size", size, int, "an int")
        _check_type("resize_size", resize_size, int, "an int")
        _check_type("flip", flip, bool, "a bool")
        _check_type("return_index", return_index, bool, "a bool")
        _check_type("max_image_pixels", max_image_pixels, int, "an int")
        _check_type("even_shards", even_shards, bool, "a bool")
        engine = _engine_args(batch_size, shuffle, seed, drop_last, rank, world_size, workers,
                              prefetch, memory_budget, on_error, max_errors)
        self._return_index = return_index
        self.audio_rate = audio_rate
        self._loader = _feedline.video_loader(
            clip_len, frame_step, 0.0 if fps is None else float(fps), clips_per_video,
            clip_starts or "", 0 if audio_rate is None else audio_rate, audio_channels,
            0.0 if audio_seconds is None else float(audio_seconds), source=source,
            transform=transform, size=size, resize_size=resize_size, scale=_pair("scale", scale),
            ratio=_pair("ratio", ratio), flip=flip, io_depth=_parse_count("io_depth", io_depth),
            read_timeout_ms=1000.0 * _timeout(read_timeout), max_image_pixels=max_image_pixels,
            max_record_bytes=_parse_bytes("max_record_bytes", max_record_bytes),
            worker_nice=worker_nice, epoch_head_start=epoch_head_start,
            even_shards=even_shards, **engine)
        self.source = source
        self.batch_size = batch_size
        self.seed = seed
        self.rank = engine["rank"]
        self.world_size = engine["world_size"]
        self.drop_last = drop_last
        self.clip_len = clip_len

    def __len__(self):
        """Batches per epoch for this rank."""
        return len(self._loader)

    def __iter__(self):
        return _ClipIterator(_start_epoch(self), self._return_index, self,
                             self.audio_rate is not None)

    @property
    def num_samples(self):
        """Clips per epoch for this rank."""
        return self._loader.num_samples

    @property
    def samples(self):
        """(path, class index) pairs, as torchvision's ImageFolder.samples."""
        return [(_shown(p), c) for p, c in _feedline.image_samples(self._loader)]

    @property
    def classes(self):
        """Class names (the sub-folders; empty for list files)."""
        return list(_feedline.image_classes(self._loader))

    def __repr__(self):
        return (f"feedline.VideoLoader(source={self.source!r}, clip_len={self.clip_len}, "
                f"batch_size={self.batch_size}, rank={self.rank}, world_size={self.world_size})")


class _ClipIterator(_FieldsIterator):
    """One epoch: (clips, labels) or, with return_index, (clips, labels, indices); with audio,
    the batch's dict."""

    def __init__(self, epoch, return_index, owner, as_dict):
        super().__init__(epoch, return_index, owner)
        self._as_dict = as_dict

    def __next__(self):
        out = super().__next__()
        if self._as_dict:
            if not self._return_index:
                out.pop("index", None)
            return out
        if self._return_index:
            return out["clips"], out["label"], out["index"]
        return out["clips"], out["label"]


VideoLoader.__doc__ += _options_doc(VideoLoader, groups=("engine",))
