"""`feedline-bench --e2e`: the loaders inside a training loop, end to end.

What a GPU sees is the loader inside a training loop whose own thread needs a core and the
GIL. Each step of the simulated loop holds the GIL for C ms of the trainer thread's CPU (pure
Python bytecode, as the forward/backward launches and the optimizer are), then releases it for
G ms (time.sleep: the GPU's time, the trainer thread waits). For each (C, G) pair and each
workload, in one run, contenders interleaved round after round:

  ideal     the same loop fed batches made in advance (no loader at all)
  feedline  the workload's feedline loader with its automatic settings
  feedline (threads)
            pil only: feedline.DataLoader with executor="thread" forced (the automatic choice
            is processes for int keys; the pair shows that choice end to end)
  torch     torch's DataLoader at each --torch-workers count (persistent workers); its best
            end to end is the reference

Workloads (the bundled ImageNet-like JPEGs; random-resized-crop 224 + flip, uint8 NCHW):
  image     feedline.ImageLoader(transform="train") / torch: torchvision ImageFolder
  pil       the torchvision ImageFolder through feedline.DataLoader / through torch's DataLoader
and (the first --text-docs documents of the bundled text corpus, its SentencePiece model; 8
steps an epoch; counted in real tokens, not documents, so that padded and packed compare):
  text      feedline.TextLoader padded, --text-batch documents a batch / torch: a map-style data
            set tokenized by Python sentencepiece in the workers, padded by a collate_fn
  packed    feedline.TextLoader(pack="concat", seq_len=--seq-len), --pack-rows rows a batch /
            torch: the same padded peer (torch has no packer): the same documents, fewer steps
and (--video-dir: feedline-bench --compare-video's H.264 set; counted in clips):
  video     feedline.VideoLoader (16 frames 2 apart, 112², batch 8) / torch: the PyAV clip data
            set of bench/video_compare.py (seek, decode, crop, flip, resize in the workers)

Every contender runs --epochs whole epochs in a process of its own (the first is warm-up: the
loaders' start, the worker processes' fork); the figures cover the later epochs, epoch starts
(`iter()`) included. Reported: samples/s end to end and over the ideal; the stretch of the
step's CPU part (its wall time over C: the trainer slowed by the loader's threads, processes
and GIL); the loader's CPU per sample (the process tree's CPU less the trainer's); the time
the trainer waited for batches; peak PSS of the process tree; what feedline chose.
With --hog, another process keeps one core busy throughout (a logger, a checkpoint writer).

    /usr/bin/python3 bench/e2e_compare.py --data DIR [--text-dir DIR] [--steps 10:150,60:80,5:10]
        [--video-dir DIR] [--workloads image,pil,text,packed,video] [--torch-workers 1,2,3]
        [--rounds 2] [--epochs 4]
        [--hog] [--json FILE]
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import peer_text  # noqa: E402  (bench/: the text peer, what users run today)


# --- one contender, in its own process --------------------------------------------------------

def _spin(cpu_s):
    """Holds the GIL for `cpu_s` seconds of this thread's CPU: Python bytecode, as a training
    step's launches and optimizer are. Its wall time is what the trainer really took."""
    end = time.thread_time() + cpu_s
    x = 0
    while time.thread_time() < end:
        for k in range(200):
            x += k * k
    return x


TEXT_WORKLOADS = ("text", "packed")
THREADS = "feedline (threads)"  # the pil workload's forced-executor contender


def _make_text_loader(workload, loader, a):
    if loader == "feedline":
        import feedline
        if workload == "packed":
            return feedline.TextLoader(a.corpus, a.model, batch_size=a.pack_rows, pack="concat",
                                       seq_len=a.seq_len, add_eos=True, seed=0)
        return feedline.TextLoader(a.corpus, a.model, batch_size=a.text_batch, max_length=2048,
                                   seed=0)
    return peer_text.torch_loader(a.corpus, a.model, a.text_batch, a.workers)


def _make_video_loader(loader, a):
    import video_compare as vc
    if loader == "feedline":
        import feedline
        return feedline.VideoLoader(a.video_dir, clip_len=vc.CLIP_LEN, frame_step=vc.FRAME_STEP,
                                    size=vc.SIZE, batch_size=vc.BATCH, seed=0)
    import torch
    return torch.utils.data.DataLoader(vc.PyAVClips(a.video_dir), batch_size=vc.BATCH,
                                       shuffle=True, num_workers=a.workers,
                                       persistent_workers=a.workers > 0)


def _make_loader(a):
    import torch
    workload, loader, data, batch, workers = a.workload, a.loader, a.data, a.batch_size, a.workers
    if workload in TEXT_WORKLOADS:
        return _make_text_loader(workload, loader, a)
    if workload == "video":
        return _make_video_loader(loader, a)
    if loader == "feedline" and workload == "image":
        import feedline
        return feedline.ImageLoader(data, batch_size=batch, transform="train", size=224,
                                    seed=0)
    import torchvision
    from torchvision import transforms
    t = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                            transforms.PILToTensor()])
    ds = torchvision.datasets.ImageFolder(data, transform=t)
    if loader.startswith("feedline"):
        import feedline
        return feedline.DataLoader(ds, batch_size=batch, shuffle=True,
                                   executor="thread" if loader == THREADS else "auto")
    return torch.utils.data.DataLoader(ds, batch_size=batch, shuffle=True, num_workers=workers,
                                       persistent_workers=workers > 0)


def _count(b):
    """What a batch carries: images, or for text its real tokens (padding not counted)."""
    if isinstance(b, dict) and "input_ids" in b:
        if "attention_mask" in b and "lengths" not in b:
            return int(b["attention_mask"].sum())
        return int(b["lengths"].sum())
    x = b.get("image", b.get("video")) if isinstance(b, dict) else b[0]
    return int(x.shape[0])


def _made_in_advance(a):
    """The ideal's batches: the workload's batches, made before the loop (no loader in it)."""
    import torch
    if a.workload in TEXT_WORKLOADS:
        # The feedline loader's own epoch, copied: the same steps and tokens as it gives.
        loader = _make_text_loader(a.workload, "feedline", a)
        return [{k: v.clone() for k, v in b.items()} for b in loader]
    if a.workload == "video":  # the same number of clips and batch shapes as feedline's
        import video_compare as vc
        loader = _make_video_loader("feedline", a)
        n, steps = loader.num_samples, len(loader)
        return [(torch.zeros(min(vc.BATCH, n - k * vc.BATCH), vc.CLIP_LEN, 3, vc.SIZE, vc.SIZE,
                             dtype=torch.uint8), torch.zeros(vc.BATCH, dtype=torch.int64))
                for k in range(steps)]
    n = len([f for _, _, fs in os.walk(a.data) for f in fs])
    steps = -(-n // a.batch_size)
    return [(torch.zeros(min(a.batch_size, n - k * a.batch_size), 3, 224, 224,
                         dtype=torch.uint8), torch.zeros(a.batch_size, dtype=torch.int64))
            for k in range(steps)]


def run_contender(a):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import bench_proc
    import torch
    torch.manual_seed(0)
    c_s, g_s = a.c_ms / 1000.0, a.g_ms / 1000.0
    if a.loader == "ideal":
        epochs = [_made_in_advance(a)] * a.epochs
        loader = None
    else:
        loader = _make_loader(a)
        epochs = [loader] * a.epochs
    out = {"epochs": []}
    for e, source in enumerate(epochs):
        t0 = time.perf_counter()
        cpu0 = bench_proc.tree_cpu_seconds()
        trainer_cpu = trainer_wall = waited = first_wait = 0.0
        samples = steps = 0
        it = iter(source)
        while True:
            w0 = time.perf_counter()
            try:
                b = next(it)
            except StopIteration:
                break
            w1 = time.perf_counter()
            waited += w1 - w0
            if steps == 0:
                first_wait = w1 - w0 + (w0 - t0)  # iter() and the first batch
            samples += _count(b)
            steps += 1
            c0 = time.thread_time()
            _spin(c_s)
            w2 = time.perf_counter()
            trainer_cpu += time.thread_time() - c0
            trainer_wall += w2 - w1
            time.sleep(g_s)
        wall = time.perf_counter() - t0
        cpu = bench_proc.tree_cpu_seconds() - cpu0
        out["epochs"].append(dict(samples=samples, steps=steps, wall=wall, cpu=cpu,
                                  trainer_cpu=trainer_cpu, trainer_wall=trainer_wall,
                                  waited=waited, first_wait=first_wait))
    if loader is not None and hasattr(loader, "stats"):
        st = loader.stats()
        out["workers"] = st.get("workers")
        py = st.get("python") or {}
        out["chose"] = py.get("executor") or "engine"
        if py.get("processes"):
            out["processes"] = py["processes"]
    print("result " + json.dumps(out), flush=True)


# --- the driver ---------------------------------------------------------------------------------

def _measure(cmd, env):
    """Runs one contender; returns (its result dict, peak PSS of its process tree), sampled as
    python_compare.py samples its contenders (run_sampled)."""
    from python_compare import run_sampled
    _, out, err, peak = run_sampled(cmd, env)
    for line in out.splitlines():
        if line.startswith("result "):
            return json.loads(line[7:]), peak["pss"]
    raise SystemExit(f"contender {' '.join(cmd[2:])} failed:\n{err[-3000:]}")


def _summary(r, c_ms, skip_first=1):
    eps = r["epochs"][skip_first:]
    samples = sum(e["samples"] for e in eps)
    wall = sum(e["wall"] for e in eps)
    steps = sum(e["steps"] for e in eps)
    trainer_cpu = sum(e["trainer_cpu"] for e in eps)
    return dict(rate=samples / wall, samples_per_epoch=samples / len(eps), stretch=(sum(e["trainer_wall"] for e in eps) /
                                               max(1e-9, steps * c_ms / 1000.0)),
                loader_cpu_ms=1000.0 * (sum(e["cpu"] for e in eps) - trainer_cpu) / samples,
                waited_ms=1000.0 * sum(e["waited"] for e in eps) / steps,
                epoch_start_ms=1000.0 * sum(e["first_wait"] for e in eps) / len(eps))


def _hog():
    """Another process keeping one core busy."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data")
    p.add_argument("--steps", default="10:150,60:80,5:10",
                   help="C:G pairs in ms (GPU-bound, launch-bound, loader-bound)")
    p.add_argument("--workloads", help="default: image,pil, and text,packed with --text-dir")
    p.add_argument("--text-dir", help="corpus.txt (one document a line) and m.model")
    p.add_argument("--video-dir", help="the video set (feedline-bench --compare-video's)")
    p.add_argument("--text-docs", type=int, default=2048)
    p.add_argument("--text-batch", type=int, default=256, help="documents a padded batch")
    p.add_argument("--pack-rows", type=int, default=12, help="rows a packed batch")
    p.add_argument("--seq-len", type=int, default=1024, help="tokens a packed row")
    p.add_argument("--torch-workers", default="1,2,3")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--hog", action="store_true", help="another process keeps one core busy")
    p.add_argument("--json")
    p.add_argument("--quiet", action="store_true")
    # One contender (internal).
    p.add_argument("--contender", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("--loader", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--c-ms", type=float, help=argparse.SUPPRESS)
    p.add_argument("--g-ms", type=float, help=argparse.SUPPRESS)
    p.add_argument("--corpus", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.contender:
        return run_contender(a)
    if not a.data:
        p.error("--data is required")
    steps = [tuple(float(v) for v in s.split(":")) for s in a.steps.split(",")]
    workloads = (a.workloads or ("image,pil,text,packed" if a.text_dir else "image,pil") +
                 (",video" if a.video_dir else "")).split(",")
    if "video" in workloads:
        if not a.video_dir:
            p.error("the video workload needs --video-dir")
        import video_compare
        video_compare.make_videos(a.video_dir, 120, a.quiet)  # once (as --compare-video does)
    text_args, work = [], None
    if any(w in TEXT_WORKLOADS for w in workloads):
        if not a.text_dir:
            p.error("the text workloads need --text-dir (corpus.txt and m.model)")
        # The corpus's first --text-docs documents, in a file of their own.
        import tempfile
        work = tempfile.mkdtemp(prefix="feedline-e2e-")
        corpus = os.path.join(work, "corpus.txt")
        with open(os.path.join(a.text_dir, "corpus.txt"), encoding="utf-8") as f, \
                open(corpus, "w", encoding="utf-8") as out:
            kept = 0
            for line in f:
                if kept == a.text_docs:
                    break
                if line.strip():
                    out.write(line)
                    kept += 1
        text_args = ["--corpus", corpus, "--model", os.path.join(a.text_dir, "m.model"),
                     "--text-batch", str(a.text_batch), "--pack-rows", str(a.pack_rows),
                     "--seq-len", str(a.seq_len)]
    torch_workers = [int(w) for w in a.torch_workers.split(",") if w]
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [HERE, env.get("PYTHONPATH", "")] if p)
    results = {}  # (workload, C, G, contender) -> [summaries]
    hog = _hog() if a.hog else None
    try:
        for rnd in range(a.rounds):
            for c_ms, g_ms in steps:
                for wl in workloads:
                    contenders = ([("ideal", 0), ("feedline", 0)] +
                                  ([(THREADS, 0)] if wl == "pil" else []) +
                                  [("torch", w) for w in torch_workers])
                    if rnd % 2 == 1:
                        contenders.reverse()  # interleaved: no contender always first
                    for loader, w in contenders:
                        cmd = [sys.executable, os.path.abspath(__file__), "--contender",
                               "--data", a.data, "--workload", wl, "--loader", loader,
                               "--workers", str(w), "--c-ms", str(c_ms), "--g-ms", str(g_ms),
                               "--epochs", str(a.epochs), "--batch-size", str(a.batch_size)
                               ] + (text_args if wl in TEXT_WORKLOADS else []) + (
                                   ["--video-dir", a.video_dir] if wl == "video" else [])
                        r, pss = _measure(cmd, env)
                        s = _summary(r, c_ms)
                        s["pss_mib"] = pss / 2**20
                        s["chose"] = r.get("chose")
                        s["processes"] = r.get("processes")
                        s["workers"] = r.get("workers")
                        name = loader if loader != "torch" else f"torch (num_workers={w})"
                        results.setdefault((wl, c_ms, g_ms, name), []).append(s)
                        if not a.quiet:
                            print(f"  round {rnd + 1} C={c_ms:g} G={g_ms:g} {wl:5s} {name:24s} "
                                  f"{s['rate']:7.1f} /s  stretch {s['stretch']:.2f}  "
                                  f"wait {s['waited_ms']:6.1f} ms/step", file=sys.stderr,
                                  flush=True)
    finally:
        if hog is not None:
            hog.kill()
        if work is not None:  # the text workloads' corpus
            shutil.rmtree(work, ignore_errors=True)
    # Means over the rounds, and the ratios.
    mean = {}
    for key, runs in results.items():
        m = {k: sum(r[k] for r in runs) / len(runs) for k in
             ("rate", "samples_per_epoch", "stretch", "loader_cpu_ms", "waited_ms",
              "epoch_start_ms", "pss_mib")}
        m["chose"] = runs[-1]["chose"]
        m["processes"] = runs[-1]["processes"]
        m["workers"] = runs[-1]["workers"]
        mean[key] = m
    print(f"\nend to end{' (another process busy on one core)' if a.hog else ''}: "
          f"batch {a.batch_size}, epochs 2-{a.epochs} of {a.epochs}, {a.rounds} rounds (means)")
    print("(samples/s: images for image and pil, real tokens for text and packed)")
    print(f"{'step C:G ms':12s} {'workload':8s} {'contender':24s} {'samples/s':>9s} "
          f"{'/ideal':>7s} {'stretch':>7s} {'wait/step':>10s} {'1st batch':>10s} "
          f"{'loader CPU':>11s} "  # per sample
          f"{'peak PSS':>9s}  chose")
    report = []
    for c_ms, g_ms in steps:
        for wl in workloads:
            ideal = mean[(wl, c_ms, g_ms, "ideal")]["rate"]
            torch_keys = [k for k in mean if k[:3] == (wl, c_ms, g_ms) and k[3].startswith("torch")]
            best = max(torch_keys, key=lambda k: mean[k]["rate"])
            forced = [(wl, c_ms, g_ms, THREADS)] if (wl, c_ms, g_ms, THREADS) in mean else []
            for key in [(wl, c_ms, g_ms, "ideal"), (wl, c_ms, g_ms, "feedline")] + forced + sorted(
                    torch_keys):
                m = mean[key]
                chose = ""
                if key[3].startswith("feedline"):
                    chose = (f"{m['chose']}" + (f", {m['processes']} processes"
                                                 if m.get("processes") else "") +
                             (f", {m['workers']} workers" if m.get("workers") else ""))
                print(f"{c_ms:g}:{g_ms:g}".ljust(12) + f" {wl:8s} {key[3]:24s} "
                      f"{m['rate']:9.1f} {m['rate'] / ideal:6.2f}x {m['stretch']:6.2f}x "
                      f"{m['waited_ms']:8.1f}ms {m['epoch_start_ms']:8.1f}ms "
                      f"{m['loader_cpu_ms'] * 1000:8.1f} us "
                      f"{m['pss_mib']:6.0f} MiB  {chose}")
            f = mean[(wl, c_ms, g_ms, "feedline")]
            t = mean[best]
            line = dict(step=f"{c_ms:g}:{g_ms:g}", workload=wl,
                        feedline_over_ideal=f["rate"] / ideal,
                        feedline_over_best_torch=f["rate"] / t["rate"], best_torch=best[3],
                        feedline_stretch=f["stretch"], torch_stretch=t["stretch"],
                        pss_over_torch=f["pss_mib"] / max(1e-9, t["pss_mib"]))
            if forced:  # the automatic executor against the better of the two forced ones
                line["auto_over_best_forced"] = f["rate"] / max(f["rate"], mean[forced[0]]["rate"])
            report.append(line)
            print(f"  -> feedline / ideal {line['feedline_over_ideal']:.2f}x, / best torch "
                  f"({best[3]}) {line['feedline_over_best_torch']:.2f}x; step CPU stretched "
                  f"{f['stretch']:.2f}x (torch {t['stretch']:.2f}x); peak PSS "
                  f"{line['pss_over_torch']:.2f}x torch's" +
                  (f"; automatic executor / the better forced one "
                   f"{line['auto_over_best_forced']:.2f}x" if forced else ""))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(dict(hog=a.hog, batch_size=a.batch_size, epochs=a.epochs,
                           rounds=a.rounds, ratios=report,
                           contenders={"|".join(str(x) for x in k): v for k, v in mean.items()}),
                      fh, indent=1)


if __name__ == "__main__":
    sys.exit(main())
