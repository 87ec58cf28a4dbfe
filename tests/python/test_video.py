"""feedline.VideoLoader against PyAV (FFmpeg's libraries through Python, not written here):
the frames of every clip are the frames PyAV decodes at the same presentation timestamps, for
files with B-frames, a variable frame rate, an edit list and VP9; the same bytes for any worker
count and across a resume; broken files are DataErrors naming them."""

import fractions
import os
import shutil
import subprocess
import threading

import numpy as np
import pytest

import feedline
import util

av = pytest.importorskip("av")
torch = pytest.importorskip("torch")
FFMPEG = shutil.which("ffmpeg")
pytestmark = pytest.mark.skipif(FFMPEG is None, reason="ffmpeg (cmake/install-deps.sh) missing")

# Both convert with swscale (bilinear) to planar GBR: feedline straight into the batch, PyAV's
# to_ndarray(format="gbrp") into an array (in R, G, B order). Packed RGB24 would differ: swscale
# takes another path for it (nearest chroma), up to 255 at sharp colour edges.
TOLERANCE = 0


def _ffmpeg(*args):
    subprocess.run([FFMPEG, "-v", "error", "-y", *args], check=True)


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Test files made with the ffmpeg CLI: 'cfr' (H.264 with B-frames, 25 fps, 64x64), 'vfr'
    (H.264 in Matroska, frames dropped irregularly: variable frame rate, 64x48), 'edit' (an MP4
    whose edit list skips its first frames) and 'vp9' (WebM, 48x64)."""
    d = tmp_path_factory.mktemp("videos")
    src = ["-f", "lavfi", "-i"]
    _ffmpeg(*src, "testsrc2=size=64x64:rate=25", "-t", "2", "-c:v", "libx264", "-bf", "2",
            "-g", "12", "-pix_fmt", "yuv420p", str(d / "cfr.mp4"))
    _ffmpeg(*src, "testsrc2=size=64x48:rate=30", "-t", "2", "-vf",
            "select='not(mod(n\\,3))+eq(mod(n\\,7)\\,0)'", "-fps_mode", "vfr", "-c:v", "libx264",
            "-bf", "2", "-pix_fmt", "yuv420p", str(d / "vfr.mkv"))
    _ffmpeg("-ss", "0.3", "-i", str(d / "cfr.mp4"), "-c", "copy", str(d / "edit.mp4"))
    _ffmpeg(*src, "testsrc2=size=48x64:rate=24", "-t", "1.5", "-c:v", "libvpx-vp9",
            "-pix_fmt", "yuv420p", str(d / "vp9.webm"))
    return d


def _pyav(path):
    """Every frame PyAV decodes: [(pts, HxWx3 uint8 RGB)], and the stream's clock."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        frames = [(f.pts, f.to_ndarray(format="gbrp")) for f in c.decode(video=0)]
        info = dict(time_base=s.time_base, rate=s.average_rate or s.guessed_rate,
                    start=s.start_time or 0, nb=s.frames,
                    duration=(s.duration if s.duration else
                              int(c.duration / 1e6 / s.time_base) if c.duration else 0))
    return frames, info


def _expected(frames, info, clip_len, frame_step, fps, train_start=None):
    """The clip the documented rule gives: the middle start (eval) among the frames where the
    clip fits, at the average rate; the frame at time t is the last with pts <= t."""
    tb, rate = fractions.Fraction(info["time_base"]), fractions.Fraction(info["rate"])
    n = int(info["duration"] * tb * rate)
    if info["nb"]:
        n = min(n, info["nb"]) if n > 0 else info["nb"]
    n = max(n, 1)
    span = (clip_len - 1) * frame_step if not fps else \
        int(np.ceil((clip_len - 1) / fps * float(rate) - 1e-9))
    room = n - 1 - span
    k = (room // 2 if room > 0 else 0) if train_start is None else train_start
    if callable(train_start):  # the start from the room where a clip fits
        k = train_start(max(room, 0))

    def pts_of(frames_offset):  # av_rescale_q: round to nearest
        return info["start"] + round(fractions.Fraction(frames_offset) / rate / tb)
    if fps:
        t0 = pts_of(k)
        targets = [t0 + round(i / fps / float(tb)) for i in range(clip_len)]
    else:
        targets = [pts_of(k + i * frame_step) for i in range(clip_len)]
    out = []
    for t in targets:
        shown = [img for p, img in frames if p <= t]
        out.append(shown[-1] if shown else frames[0][1])
    return np.stack(out)  # [T, H, W, 3]


def _clip_hwc(clips, b=0):
    return clips[b].permute(0, 2, 3, 1).numpy()  # [T, H, W, 3]


@pytest.mark.parametrize("name,size,clip_len,frame_step,fps", [
    ("cfr.mp4", 64, 8, 3, None),
    ("cfr.mp4", 64, 16, 1, None),
    ("cfr.mp4", 64, 40, 2, None),   # longer than the video: the last frame repeats
    ("vfr.mkv", 48, 10, 2, None),
    ("vfr.mkv", 48, 12, 1, 12.5),   # by timestamps
    ("edit.mp4", 64, 12, 2, None),
    ("vp9.webm", 48, 10, 2, None),
])
def test_clip_frames_equal_pyav_frames_at_the_same_timestamps(videos, tmp_path, name, size,
                                                              clip_len, frame_step, fps):
    path = videos / name
    frames, info = _pyav(path)
    h, w = frames[0][1].shape[:2]
    lst = tmp_path / "list.txt"
    lst.write_text(f"{path} 3\n")
    # Eval with resize_size = the shorter side and size = it: for square frames the crop is the
    # whole frame, unscaled; otherwise the centre square.
    loader = feedline.VideoLoader(str(lst), clip_len=clip_len, frame_step=frame_step, fps=fps,
                                  batch_size=1, shuffle=False, transform="eval", size=size,
                                  resize_size=min(h, w))
    with util.deadline(60, "one clip"):
        (clips, labels), = list(loader)
    assert clips.dtype == torch.uint8 and tuple(clips.shape) == (1, clip_len, 3, size, size)
    assert labels.tolist() == [3]
    want = _expected(frames, info, clip_len, frame_step, fps)
    top, left = (h - size) // 2, (w - size) // 2
    want = want[:, top:top + size, left:left + size]
    got = _clip_hwc(clips)
    diff = np.abs(got.astype(int) - want.astype(int))
    # Bit for bit, but at the edges of a crop (the centre square of a non-square frame):
    # feedline converts only the crop, whose edge pixels swscale interpolates from inside it.
    inner = diff[:, 1 if top else 0:size - 1 if top else size,
                 1 if left else 0:size - 1 if left else size]
    assert inner.max() <= TOLERANCE, (inner.max(), [int(d.max()) for d in inner])
    # And each frame is nearer to its own PyAV frame than to any other (the tolerance is the
    # conversion's, never a neighbouring frame's).
    for t in range(clip_len):
        errors = [np.abs(got[t].astype(int) -
                         img[top:top + size, left:left + size].astype(int)).mean()
                  for _, img in frames]
        assert min(errors) == pytest.approx(np.abs(got[t].astype(int) - want[t].astype(int)).mean())


def _folder(videos, tmp_path, copies=3):
    root = tmp_path / "clips"
    for c, names in enumerate([["cfr.mp4", "edit.mp4"], ["vfr.mkv", "vp9.webm"]]):
        (root / f"class{c}").mkdir(parents=True)
        for k in range(copies):
            for n in names:
                shutil.copy(videos / n, root / f"class{c}" / f"{k}_{n}")
    return root


def test_train_clips_are_the_same_for_any_worker_count_and_across_a_resume(videos, tmp_path):
    root = _folder(videos, tmp_path)
    args = dict(clip_len=6, frame_step=2, batch_size=4, size=32, seed=7, transform="train")

    def run(workers, epochs=2, loader=None):
        loader = loader or feedline.VideoLoader(str(root), workers=workers, **args)
        return loader, [(c.clone(), l.clone()) for _ in range(epochs) for c, l in loader]
    with util.deadline(120, "three runs"):
        loader, one = run(1)
        _, two = run(2)
    assert loader.classes == ["class0", "class1"] and len(loader.samples) == 12
    assert len(one) == 2 * 3
    for (a, la), (b, lb) in zip(one, two):
        assert torch.equal(a, b) and torch.equal(la, lb)
    # Epochs differ (their starts, crops and flips are drawn anew), and so do clips.
    assert not torch.equal(one[0][0], one[3][0])
    # Resume after the first batch of epoch 1.
    resumed = feedline.VideoLoader(str(root), workers=2, **args)
    for _ in resumed:
        pass
    it = iter(resumed)
    next(it)
    state = resumed.state_dict()
    del it
    again = feedline.VideoLoader(str(root), workers=1, **args)
    again.load_state_dict(state)
    rest = [(c, l) for c, l in again]
    assert len(rest) == 2
    for (a, la), (b, lb) in zip(one[4:], rest):
        assert torch.equal(a, b) and torch.equal(la, lb)


def test_train_crops_and_flips_every_frame_of_a_clip_alike(videos, tmp_path):
    """One crop box and one flip per clip: a clip of the same frame repeated (a 1-frame-step
    clip of a still video) has identical frames; flipped clips mirror unflipped ones."""
    still = tmp_path / "still"
    (still / "a").mkdir(parents=True)
    _ffmpeg("-f", "lavfi", "-i", "testsrc2=size=96x64:rate=10", "-frames:v", "1", "-c:v",
            "libx264", "-pix_fmt", "yuv420p", str(tmp_path / "one.mp4"))
    for k in range(8):
        shutil.copy(tmp_path / "one.mp4", still / "a" / f"{k}.mp4")
    loader = feedline.VideoLoader(str(still), clip_len=5, batch_size=8, size=24, seed=3,
                                  shuffle=False)
    (clips, _), = list(loader)
    for b in range(8):
        for t in range(1, 5):
            assert torch.equal(clips[b, t], clips[b, 0])
    flat = clips[:, 0].flatten(1)
    assert len({tuple(x.tolist()) for x in flat}) > 1  # crops differ between clips


@pytest.mark.parametrize("name,clips", [("cfr.mp4", 3), ("vfr.mkv", 4), ("vp9.webm", 2)])
def test_several_uniform_clips_per_video_are_pyavs_frames_at_their_places(videos, tmp_path,
                                                                          name, clips):
    """clips_per_video=K with eval: sample i is clip i % K of video i // K, clip k starting at
    (2k + 1) / 2K of the frames where a clip fits (one clip: the middle one), each equal to
    PyAV's frames at those timestamps; the labels are the video's."""
    path = videos / name
    frames, info = _pyav(path)
    h, w = frames[0][1].shape[:2]
    size = min(h, w)
    lst = tmp_path / "list.txt"
    lst.write_text(f"{path} 1\n{path} 2\n")
    loader = feedline.VideoLoader(str(lst), clip_len=6, frame_step=2, clips_per_video=clips,
                                  batch_size=clips, shuffle=False, transform="eval", size=size,
                                  resize_size=size, return_index=True)
    assert loader.num_samples == 2 * clips and len(loader) == 2
    assert [p for p, _ in loader.samples] == [str(path)] * 2  # the videos, not their clips
    with util.deadline(60, "the clips"):
        batches = list(loader)
    top, left = (h - size) // 2, (w - size) // 2
    for v, (c, labels, index) in enumerate(batches):
        assert labels.tolist() == [v + 1] * clips
        assert index.tolist() == list(range(v * clips, (v + 1) * clips))
        starts = set()
        for k in range(clips):
            want = _expected(frames, info, 6, 2, None,
                             train_start=lambda room, k=k: room * (2 * k + 1) // (2 * clips))
            want = want[:, top:top + size, left:left + size]
            got = _clip_hwc(c, k)
            assert np.abs(got.astype(int) - want.astype(int))[:, 1:-1, 1:-1].max() <= TOLERANCE
            starts.add(got[0].tobytes())
        assert len(starts) == clips  # K different places in the video
    if h == w:  # train with uniform starts: the same places (a whole-frame crop, no flip here)
        train = feedline.VideoLoader(str(lst), clip_len=6, frame_step=2, clips_per_video=clips,
                                     clip_starts="uniform", batch_size=clips, shuffle=False,
                                     transform="train", size=size, scale=(1.0, 1.0),
                                     ratio=(1.0, 1.0), flip=False)
        for (c, _, _), (t, _) in zip(batches, train):
            assert torch.equal(c, t)


def test_several_random_clips_per_video_are_drawn_apart_and_resume_exactly(videos, tmp_path):
    """clips_per_video=K with train: K clips of every video each epoch, each its own start, crop
    and flip; the same for any worker count, shuffled over the epoch, and resumed exactly;
    clip_starts="uniform" with train keeps uniform starts and random crops."""
    root = _folder(videos, tmp_path, copies=1)
    args = dict(clip_len=4, frame_step=2, batch_size=4, size=32, seed=11, clips_per_video=3,
                return_index=True)
    one = feedline.VideoLoader(str(root), workers=1, **args)
    two = feedline.VideoLoader(str(root), workers=2, **args)
    assert one.num_samples == 12 and len(one) == 3
    with util.deadline(120, "two epochs twice"):
        a = [(c.clone(), i.clone()) for _ in range(2) for c, _, i in one]
        b = [(c.clone(), i.clone()) for _ in range(2) for c, _, i in two]
    for (ca, ia), (cb, ib) in zip(a, b):
        assert torch.equal(ca, cb) and torch.equal(ia, ib)
    first = torch.cat([i for _, i in a[:3]]).tolist()
    assert sorted(first) == list(range(12)) and first != list(range(12))  # every clip, shuffled
    clips = dict(zip(first, torch.cat([c for c, _ in a[:3]])))
    for v in range(4):  # a video's three clips differ from one another
        assert len({clips[v * 3 + k].numpy().tobytes() for k in range(3)}) == 3
    # Resume after the first batch of epoch 1.
    resumed = feedline.VideoLoader(str(root), workers=2, **args)
    for _ in resumed:
        pass
    it = iter(resumed)
    next(it)
    state = resumed.state_dict()
    del it
    again = feedline.VideoLoader(str(root), workers=1, **args)
    again.load_state_dict(state)
    rest = [(c, i) for c, _, i in again]
    assert len(rest) == 2
    for (ca, ia), (cb, ib) in zip(a[4:], rest):
        assert torch.equal(ca, cb) and torch.equal(ia, ib)
    # A state of one clip per video does not resume three (another epoch layout).
    with pytest.raises(ValueError):
        feedline.VideoLoader(str(root), **dict(args, clips_per_video=1)).load_state_dict(state)
    # Errors name the file and the clip.
    bad = tmp_path / "bad" / "a"
    bad.mkdir(parents=True)
    (bad / "x.mp4").write_bytes(b"not a video")
    with pytest.raises(feedline.DataError, match=r"x\.mp4 \(clip [12] of 2\)"):
        list(feedline.VideoLoader(str(tmp_path / "bad"), clips_per_video=2, batch_size=2))
    for kwargs, err in [(dict(clips_per_video=0), ValueError),
                        (dict(clips_per_video=2000), ValueError),
                        (dict(clip_starts="middle"), ValueError),
                        (dict(clips_per_video=2.0), TypeError)]:
        with pytest.raises(err, match=list(kwargs)[0]):
            feedline.VideoLoader(str(root), **kwargs)


@pytest.fixture(scope="module")
def with_audio(tmp_path_factory):
    """'av.mp4': H.264 + AAC, stereo at 44.1 kHz, 25 fps, 3 s; 'av.webm': VP9 + Opus, mono at
    48 kHz, 30 fps, 3 s. The sound is a chirp (no period: a clip's audio matches the stream at
    one place only)."""
    d = tmp_path_factory.mktemp("audio")
    src = ["-f", "lavfi", "-i"]
    chirp = "0.4*sin(2*PI*(150+300*t)*t)"
    _ffmpeg(*src, "testsrc2=size=64x64:rate=25", *src,
            f"aevalsrc={chirp}|0.3*sin(2*PI*(900-200*t)*t):s=44100", "-t", "3",
            "-c:v", "libx264", "-pix_fmt", "yuv420p", "-c:a", "aac", str(d / "av.mp4"))
    _ffmpeg(*src, "testsrc2=size=64x64:rate=30", *src, f"aevalsrc={chirp}:s=48000", "-t", "3",
            "-c:v", "libvpx-vp9", "-c:a", "libopus", str(d / "av.webm"))
    return d


def _pyav_audio(path, rate, channels):
    """The whole audio stream decoded and resampled by PyAV (FFmpeg's aresample), back to back:
    (the first sample's index on the file's clock, from its timestamp; [C, N])."""
    with av.open(str(path)) as c:
        res = av.AudioResampler(format="fltp", layout="mono" if channels == 1 else "stereo",
                                rate=rate)
        out = [o for f in c.decode(audio=0) for o in res.resample(f)] + res.resample(None)
    first = round(out[0].pts * out[0].time_base * rate)
    return first, np.concatenate([o.to_ndarray() for o in out], axis=1)


@pytest.mark.parametrize("name,rate,channels,exact", [
    ("av.mp4", 44100, 2, True), ("av.mp4", 16000, 1, True),
    ("av.webm", 48000, 1, False), ("av.webm", 22050, 2, False)])
def test_clip_audio_is_pyavs_resampled_audio_at_the_clips_time(with_audio, tmp_path, name, rate,
                                                               channels, exact):
    """audio_rate: each clip's audio is the file's audio from the clip's start time, resampled
    as FFmpeg resamples the whole stream (PyAV's AudioResampler). AAC in MP4 (timestamps in
    samples, the frames' times the clip's): at the first frame's time exactly, equal to 1e-4 (AAC's
    noise substitution draws from a generator that a seek restarts: decoded from the file's start
    the samples are bit for bit the same). Opus in WebM (timestamps in milliseconds; the clip's
    start lies within its first frame's time on screen): there, to a millisecond, equal to 1e-3
    (Opus converges after a seek; PyAV's own seek differs by as much) at the stream's rate;
    resampled, the sample grid is anchored at a millisecond timestamp, so it may sit up to half
    a millisecond off the whole stream's: 2e-2 there."""
    path = with_audio / name
    frames, info = _pyav(path)
    first, ref = _pyav_audio(path, rate, channels)
    lst = tmp_path / "list.txt"
    lst.write_text(f"{path} 4\n")
    clips, fps, clip_len = 3, 8.0, 8
    loader = feedline.VideoLoader(str(lst), clip_len=clip_len, fps=fps, clips_per_video=clips,
                                  transform="eval", size=64, resize_size=64, batch_size=clips,
                                  shuffle=False, audio_rate=rate, audio_channels=channels)
    with util.deadline(60, "the clips"):
        b, = list(loader)
    n = round(clip_len / fps * rate)
    assert set(b) == {"clips", "audio", "audio_samples", "label"}
    assert tuple(b["audio"].shape) == (clips, channels, n) and b["audio"].dtype == torch.float32
    assert b["audio_samples"].tolist() == [n] * clips and b["label"].tolist() == [4] * clips
    tb = fractions.Fraction(info["time_base"])
    for k in range(clips):
        # The clip's first frame (constant frame rate: its time is the clip's start), found
        # among PyAV's frames (the frames themselves are checked above).
        f0 = _clip_hwc(b["clips"], k)[0].astype(int)
        pts = min(frames, key=lambda pf: np.abs(pf[1].astype(int) - f0).mean())[0]
        at = round(pts * tb * rate) - first
        got = b["audio"][k].numpy()
        ms, frame = rate // 1000 + 1, round(rate / float(info["rate"]))
        window = range(0, 1) if exact else range(-ms, frame + ms)
        diff = {d: np.abs(got - ref[:, at + d:at + d + n]).max()
                for d in window if at + d >= 0 and at + d + n <= ref.shape[1]}
        best = min(diff, key=diff.get)
        tolerance = 1e-4 if exact else 1e-3 if rate == 48000 else 2e-2
        assert diff[best] <= tolerance, (k, best, diff[best])
        # At its place: a sample's shift would differ by far more.
        assert np.abs(got - ref[:, at + best + 1:at + best + 1 + n]).max() > 1e-2, k


def test_clip_audio_without_a_stream_or_past_its_end_is_silence_counted(with_audio, videos,
                                                                        tmp_path):
    lst = tmp_path / "list.txt"
    lst.write_text(f"{videos / 'cfr.mp4'} 0\n{with_audio / 'av.mp4'} 1\n")
    # 40 frames at 8 a second: a 5 s clip of a 2 s and a 3 s file, from their first frames.
    loader = feedline.VideoLoader(str(lst), clip_len=40, fps=8.0, transform="eval", size=32,
                                  resize_size=32, batch_size=2, shuffle=False, audio_rate=8000)
    b, = list(loader)
    n = 5 * 8000
    assert b["audio"].shape == (2, 1, n)
    assert b["audio_samples"][0] == 0 and not b["audio"][0].any()  # no audio stream
    have = int(b["audio_samples"][1])
    assert 2.8 * 8000 < have < 3.1 * 8000  # the file's 3 s of audio
    assert b["audio"][1, :, :have].abs().max() > 0.05 and not b["audio"][1, :, have + 100:].any()
    # With frame_step the clip's span depends on each file's rate: audio_seconds is needed.
    with pytest.raises(ValueError, match="audio_seconds"):
        feedline.VideoLoader(str(lst), clip_len=8, frame_step=2, audio_rate=8000)
    ok = feedline.VideoLoader(str(lst), clip_len=8, frame_step=2, audio_rate=8000,
                              audio_seconds=0.5, batch_size=2, shuffle=False, transform="eval",
                              size=32, resize_size=32)
    assert next(iter(ok))["audio"].shape == (2, 1, 4000)
    for kwargs, name in [(dict(audio_rate=100), "audio_rate"),
                         (dict(audio_rate=8000, audio_channels=3), "audio_channels"),
                         (dict(audio_rate=8000, audio_seconds=-1.0), "audio_seconds")]:
        with pytest.raises(ValueError, match=name):
            feedline.VideoLoader(str(lst), fps=8.0, **kwargs)


def test_broken_files_are_data_errors_naming_them(videos, tmp_path):
    root = tmp_path / "bad"
    (root / "a").mkdir(parents=True)
    good = (videos / "cfr.mp4").read_bytes()
    cases = {
        "truncated.mp4": good[: len(good) // 3],
        "garbage.mp4": os.urandom(4000),
        "empty.mp4": b"",
        "text.mkv": b"not a video at all\n" * 50,
    }
    _ffmpeg("-f", "lavfi", "-i", "sine=frequency=440:duration=1", str(tmp_path / "audio.mkv"))
    cases["audio_only.mkv"] = (tmp_path / "audio.mkv").read_bytes()
    for name, data in cases.items():
        (root / "a" / name).write_bytes(data)
    shutil.copy(videos / "cfr.mp4", root / "a" / "zz_good.mp4")
    for name in cases:
        lst = tmp_path / f"{name}.txt"
        lst.write_text(f"{root / 'a' / name} 0\n")
        loader = feedline.VideoLoader(str(lst), clip_len=4, batch_size=1, transform="eval",
                                      size=32)
        with util.deadline(30, name), pytest.raises(feedline.DataError) as e:
            list(loader)
        assert name in str(e.value), str(e.value)
        assert "video" in str(e.value)
    skip = feedline.VideoLoader(str(root), clip_len=4, batch_size=2, size=32, on_error="skip",
                                max_errors=100)
    with util.deadline(60, "an epoch with on_error='skip'"), pytest.warns(RuntimeWarning):
        n = sum(c.shape[0] for c, _ in skip)
    assert n == len(cases) + 1
    assert skip.stats()["error_count"] == len(cases)


def test_arguments_are_checked_by_name(videos, tmp_path):
    root = _folder(videos, tmp_path, copies=1)
    for kwargs, name in [(dict(clip_len=0), "clip_len"), (dict(frame_step=0), "frame_step"),
                         (dict(fps=-1), "fps"), (dict(transform="eval_fast"), "transform"),
                         (dict(size=0), "size")]:
        with pytest.raises(ValueError, match=name):
            feedline.VideoLoader(str(root), **kwargs)
    with pytest.raises(TypeError, match="clip_len"):
        feedline.VideoLoader(str(root), clip_len="16")
    with pytest.raises(FileNotFoundError):
        feedline.VideoLoader(str(tmp_path / "nowhere"))
    empty = tmp_path / "no_videos" / "a"
    empty.mkdir(parents=True)
    (empty / "x.jpg").write_bytes(b"")
    with pytest.raises(ValueError, match=r"\.mp4"):
        feedline.VideoLoader(str(tmp_path / "no_videos"))


def test_decoder_threads_never_call_into_python_through_ffmpeg_logging(videos, tmp_path):
    """PyAV forwards FFmpeg's log messages to Python's logging, taking the GIL in whatever
    thread logs. feedline's decoder threads log nothing there (their errors come back as
    DataErrors): otherwise every swscale setup and every corrupt packet in a worker would take
    the trainer's GIL, and a worker that asks for it while the interpreter exits aborts it."""
    import logging
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("libav")
    before = av.logging.get_level()
    av.logging.set_level(av.logging.VERBOSE)
    logger.addHandler(handler)
    try:
        with av.open(str(videos / "vp9.webm")) as c:  # PyAV itself still logs through Python
            next(c.decode(video=0)).to_ndarray(format="gbrp")
        root = _folder(videos, tmp_path, copies=1)
        (root / "class0" / "cut.mp4").write_bytes((videos / "cfr.mp4").read_bytes()[:5000])
        loader = feedline.VideoLoader(str(root), clip_len=4, batch_size=2, size=24,
                                      on_error="skip", max_errors=10)
        with util.deadline(60, "an epoch"), pytest.warns(RuntimeWarning):
            for _ in loader:
                pass
        assert loader.stats()["error_count"] == 1
        feedline_records = [r for r in records if r.thread != threading.main_thread().ident]
        assert not feedline_records, [r.getMessage() for r in feedline_records]
    finally:
        logger.removeHandler(handler)
        av.logging.set_level(before)


def test_the_video_benchmark_runs(tmp_path):
    """bench/video_compare.py (feedline-bench --compare-video) end to end on a few videos."""
    import json
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "..", "bench", "video_compare.py")
    out = tmp_path / "video.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, script, "--data", str(tmp_path / "videos"), "--videos", "4",
                    "--epochs", "2", "--rounds", "1", "--torch-workers", "1", "--json", str(out),
                    "--quiet"], check=True, env=env, timeout=300, capture_output=True)
    result = json.loads(out.read_text())
    assert set(result["clips_per_s"]) == {"feedline", "limit", "torch+pyav/1"}
    assert all(v > 0 for v in result["clips_per_s"].values())
    assert result["feedline_vs_decode_limit"] > 0


def test_webdataset_shards_of_videos_give_the_clips_of_the_same_files(videos, tmp_path):
    import io
    import tarfile
    files = [("cfr.mp4", 0), ("vp9.webm", 1), ("vfr.mkv", 1), ("edit.mp4", 0)]
    lst = tmp_path / "list.txt"
    lst.write_text("".join(f"{videos / n} {label}\n" for n, label in files))
    for s in range(2):
        with tarfile.open(tmp_path / f"v-{s:03d}.tar", "w") as t:
            for k, (name, label) in enumerate(files[2 * s:2 * s + 2]):
                ext = name.split(".")[1]
                for member, data in [(f"s{k}.{ext}", (videos / name).read_bytes()),
                                     (f"s{k}.json", b"{}"), (f"s{k}.cls", str(label).encode())]:
                    info = tarfile.TarInfo(member)
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
    args = dict(clip_len=5, frame_step=2, batch_size=4, shuffle=False, seed=1, size=32)
    (a, la), = list(feedline.VideoLoader(str(tmp_path / "v-{000..001}.tar"), **args))
    (b, lb), = list(feedline.VideoLoader(str(lst), **args))
    assert la.tolist() == [0, 1, 1, 0]
    assert torch.equal(la, lb) and torch.equal(a, b)
    # A key without a video member is the sample's error, named.
    with tarfile.open(tmp_path / "bad.tar", "w") as t:
        info = tarfile.TarInfo("x.cls")
        info.size = 1
        t.addfile(info, io.BytesIO(b"0"))
    with pytest.raises(feedline.DataError, match=r"bad\.tar.*no video member"):
        list(feedline.VideoLoader(str(tmp_path / "bad.tar"), clip_len=2, batch_size=1))
