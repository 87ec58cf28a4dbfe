"""What a clip's audio costs: feedline.VideoLoader clips/s with and without audio_rate, in one
run, contenders interleaved round by round.

The data (made once in a temporary folder, ~20 s): 24 H.264 files of 4 s, 320x240 at 30 fps
with a keyframe a second, each with an AAC track (44.1 kHz). Clips: 16 frames at 15 a second
(about 1.07 s), RandomResizedCrop to 112, batch 8, 2 workers; with audio, its 16 kHz mono
samples (resampled from 44.1 kHz). Clips/s over three epochs after a warm-up one.

    PYTHONPATH=build/python /usr/bin/python3 bench/video_audio_cost.py [--rounds 3]
"""

import argparse
import os
import subprocess
import tempfile
import time

import feedline


def make_data(root):
    for c in range(2):
        os.makedirs(f"{root}/c{c}")
        for k in range(12):
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                            "testsrc2=size=320x240:rate=30", "-f", "lavfi", "-i",
                            f"sine=frequency={200 + 20 * k}:sample_rate=44100", "-t", "4",
                            "-c:v", "libx264", "-g", "30", "-pix_fmt", "yuv420p", "-c:a", "aac",
                            f"{root}/c{c}/v{k}.mp4"], check=True)


def clips_per_s(root, audio):
    loader = feedline.VideoLoader(root, clip_len=16, fps=15.0, size=112, resize_size=128,
                                  batch_size=8, seed=1, workers=2,
                                  audio_rate=16000 if audio else None)
    list(loader)  # warm-up epoch
    t, n = time.perf_counter(), 0
    for _ in range(3):
        for b in loader:
            n += len(b["clips"] if isinstance(b, dict) else b[0])
    return n / (time.perf_counter() - t)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    with tempfile.TemporaryDirectory(prefix="feedline-av-") as root:
        make_data(root)
        ratios = []
        for r in range(a.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            got = {audio: clips_per_s(root, audio) for audio in order}
            ratios.append(got[True] / got[False])
            print(f"round {r}: video only {got[False]:.1f} clips/s, with audio "
                  f"{got[True]:.1f} clips/s: {ratios[-1]:.3f}x", flush=True)
        print(f"with audio / without: {min(ratios):.3f}-{max(ratios):.3f}x")


if __name__ == "__main__":
    main()
