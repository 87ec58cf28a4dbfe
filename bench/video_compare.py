"""Video clips compared in one run: feedline.VideoLoader against torch's DataLoader over a PyAV
dataset (the peer most training code uses: torchvision's video datasets decode with PyAV),
and against the decode limit (FFmpeg decoding the clips' frames on one thread, times the
cores). Run by `feedline-bench --compare-video`.

The data set is made once by this script with FFmpeg (the ffmpeg command, FFmpeg's libraries):
short H.264 files with B-frames at two resolutions, constant and variable frame rates, whose
content is real: slow pans and zooms over the real-world photos of the shared test data (else
FFmpeg's synthetic sources). Every contender makes the same clips: `clip_len` frames
`frame_step` apart from a random start, one RandomResizedCrop box and flip per clip, uint8
[T, 3, size, size]. Rounds are interleaved; each figure is clips per second over the epochs
after the first (decoders warm, files in the page cache).

Usage: PYTHONPATH=build/python /usr/bin/python3 bench/video_compare.py --data DIR
       [--videos 120] [--epochs 3] [--rounds 2] [--torch-workers 1,2,3] [--json FILE]
"""
import argparse
import glob
import json
import os
import random
import shutil
import subprocess
import sys
import time

REALWORLD = os.environ.get("FEEDLINE_REALWORLD", "/work/shared/testdata/realworld")
CLIP_LEN, FRAME_STEP, SIZE, BATCH = 16, 2, 112, 8


def make_videos(root, count, quiet):
    """count videos in root/<class>/: 320x240 and 480x360, 25 and 30 fps, 2-3 s, every fourth
    with a variable frame rate (frames dropped irregularly)."""
    done = os.path.join(root, ".complete")
    if os.path.exists(done):
        return
    shutil.rmtree(root, ignore_errors=True)
    photos = sorted(p for p in glob.glob(os.path.join(REALWORLD, "**", "*"), recursive=True)
                    if p.lower().endswith((".jpg", ".jpeg")) and os.path.getsize(p) > 20000)
    rng = random.Random(0)
    t0 = time.time()
    for i in range(count):
        cls = os.path.join(root, f"class{i % 4}")
        os.makedirs(cls, exist_ok=True)
        w, h = (320, 240) if i % 2 == 0 else (480, 360)
        fps = 25 if i % 3 else 30
        seconds = 2 + (i % 3) * 0.5
        frames = int(seconds * fps)
        if photos:
            src = ["-f", "image2", "-loop", "1", "-i", photos[i % len(photos)]]
            zoom = rng.choice(["min(zoom+0.002,1.4)", "1.2", "max(1.5-on*0.003,1)"])
            vf = (f"scale={2 * w}:{2 * h}:force_original_aspect_ratio=increase,"
                  f"crop={2 * w}:{2 * h},zoompan=z='{zoom}':x='iw/2-(iw/zoom/2)+on*2':"
                  f"y='ih/2-(ih/zoom/2)':d={frames}:s={w}x{h}:fps={fps}")
        else:
            src = ["-f", "lavfi", "-i", f"mandelbrot=size={w}x{h}:rate={fps}"]
            vf = "null"
        if i % 4 == 3:  # variable frame rate
            vf += ",select='not(mod(n\\,3))+eq(mod(n\\,7)\\,0)'"
        args = ["ffmpeg", "-v", "fatal", "-y", *src, "-vf", vf, "-frames:v", str(frames),
                "-c:v", "libx264", "-preset", "veryfast", "-bf", "2", "-g", "25",
                "-pix_fmt", "yuv420p"]
        if i % 4 == 3:
            args += ["-fps_mode", "vfr"]
        subprocess.run(args + [os.path.join(cls, f"v{i:04d}.mp4")], check=True)
    open(done, "w").close()
    if not quiet:
        print(f"made {count} videos in {time.time() - t0:.0f} s under {root}", file=sys.stderr)


def clip_targets(stream, rng):
    """The clip's timestamps in `stream`'s time base (feedline's rule: a start drawn among the
    frames at the average rate where the whole clip fits)."""
    rate = stream.average_rate
    n = max(int(stream.duration * stream.time_base * rate), 1) if stream.duration else \
        (stream.frames or 1)
    room = n - 1 - (CLIP_LEN - 1) * FRAME_STEP
    k = rng.randint(0, room) if room > 0 else 0
    return [int((k + j * FRAME_STEP) / rate / stream.time_base) for j in range(CLIP_LEN)]


class PyAVClips:
    """The peer: a map-style dataset that decodes one clip with PyAV (seek to the keyframe
    before the start, decode forward, RGB24 frames) and crops/flips/resizes it with torch."""

    def __init__(self, root):
        self.files = sorted(glob.glob(os.path.join(root, "*", "*.mp4")))

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        import av
        import numpy as np
        import torch
        import torch.nn.functional as F
        from torchvision.transforms import RandomResizedCrop
        rng = random.Random()
        with av.open(self.files[i]) as c:
            s = c.streams.video[0]
            s.thread_type = "NONE"
            targets = clip_targets(s, rng)
            c.seek(targets[0], stream=s, backward=True)
            out, shown, t = [], None, 0
            for f in c.decode(s):
                while t < CLIP_LEN and targets[t] < f.pts:
                    out.append(shown if shown is not None else f.to_ndarray(format="rgb24"))
                    t += 1
                if t == CLIP_LEN:
                    break
                shown = f.to_ndarray(format="rgb24")
            while len(out) < CLIP_LEN:
                out.append(shown)
        clip = torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)  # [T, 3, H, W]
        top, left, h, w = RandomResizedCrop.get_params(clip[0], (0.08, 1.0), (3 / 4, 4 / 3))
        clip = clip[:, :, top:top + h, left:left + w].float()
        clip = F.interpolate(clip, size=(SIZE, SIZE), mode="bilinear", align_corners=False)
        if rng.random() < 0.5:
            clip = clip.flip(-1)
        return clip.round().clamp(0, 255).to(torch.uint8), i % 4


def decode_limit(root, epochs):
    """FFmpeg (through PyAV, one thread) decoding each clip's frames, no conversion: clips/s
    of one core, times the cores."""
    import av
    files = sorted(glob.glob(os.path.join(root, "*", "*.mp4")))
    rng = random.Random(1)
    best = 0.0
    for _ in range(epochs):
        t0 = time.perf_counter()
        for path in files:
            with av.open(path) as c:
                s = c.streams.video[0]
                s.thread_type = "NONE"
                targets = clip_targets(s, rng)
                c.seek(targets[0], stream=s, backward=True)
                for f in c.decode(s):
                    if f.pts >= targets[-1]:
                        break
        best = max(best, len(files) / (time.perf_counter() - t0))
    return best * (os.cpu_count() or 1)


def rate(make, epochs):
    """Clips/s over the epochs after the first."""
    loader = make()
    n, t0 = 0, None
    for e in range(epochs):
        if e == 1:
            t0, n = time.perf_counter(), 0
        for clips, _ in loader:
            n += clips.shape[0]
    return n / (time.perf_counter() - t0)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--videos", type=int, default=120)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--torch-workers", default="1,2,3")
    ap.add_argument("--json")
    ap.add_argument("--quiet", action="store_true")
    a = ap.parse_args()
    make_videos(a.data, a.videos, a.quiet)
    import torch
    import feedline
    results = {"feedline": [], "limit": []}
    workers = [int(w) for w in a.torch_workers.split(",")]
    for w in workers:
        results[f"torch+pyav/{w}"] = []
    for r in range(a.rounds):
        results["limit"].append(decode_limit(a.data, 2))
        results["feedline"].append(rate(lambda: feedline.VideoLoader(
            a.data, clip_len=CLIP_LEN, frame_step=FRAME_STEP, size=SIZE, batch_size=BATCH,
            seed=r), a.epochs))
        for w in workers:
            results[f"torch+pyav/{w}"].append(rate(lambda: torch.utils.data.DataLoader(
                PyAVClips(a.data), batch_size=BATCH, shuffle=True, num_workers=w,
                persistent_workers=True), a.epochs))
        if not a.quiet:
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in results.items()),
                  file=sys.stderr)
    best = {k: max(v) for k, v in results.items()}
    torch_best = max((v, k) for k, v in best.items() if k.startswith("torch"))
    summary = {
        "clips_per_s": best,
        "feedline_vs_best_torch": best["feedline"] / torch_best[0],
        "best_torch": torch_best[1],
        "feedline_vs_decode_limit": best["feedline"] / best["limit"],
        "clip": dict(clip_len=CLIP_LEN, frame_step=FRAME_STEP, size=SIZE, batch_size=BATCH),
        "videos": a.videos, "cores": os.cpu_count(),
    }
    print(f"clips/s (clip_len {CLIP_LEN}, frame_step {FRAME_STEP}, {SIZE}x{SIZE}, "
          f"{a.videos} videos, {os.cpu_count()} cores, best of {a.rounds} rounds)")
    for k, v in best.items():
        print(f"  {k:18s} {v:8.1f}")
    print(f"feedline / best torch ({torch_best[1]}): {summary['feedline_vs_best_torch']:.2f}x; "
          f"feedline / decode limit: {summary['feedline_vs_decode_limit']:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
