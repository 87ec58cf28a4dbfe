"""bench/e2e_compare.py (`feedline-bench --e2e`) runs end to end on a small folder: every
contender in its own process, the ideal loop, feedline's loaders and torch's DataLoader inside
the simulated training step, and the ratios it reports. A smoke test of the harness (its
figures are the benchmark's, not a test's: this machine's speed varies)."""

import json
import os
import random
import shutil
import subprocess
import sys

import pytest
import sentencepiece

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_the_end_to_end_benchmark_runs_and_reports_every_contender(small_folder, tmp_path):
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "e2e_compare.py"),
                        "--data", small_folder, "--steps", "2:10", "--torch-workers", "1",
                        "--rounds", "1", "--epochs", "2", "--batch-size", "8", "--quiet",
                        "--json", str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {x["workload"] for x in report["ratios"]} == {"image", "pil"}
    for x in report["ratios"]:
        assert 0 < x["feedline_over_ideal"] <= 1.5 and x["best_torch"] == "torch (num_workers=1)"
        assert x["feedline_stretch"] >= 0.9 and x["pss_over_torch"] > 0
    contenders = report["contenders"]
    ideal = contenders["image|2.0|10.0|ideal"]
    # 26 images, batch 8: 4 steps of 2 + 10 ms at most per epoch, with nothing to wait for.
    assert ideal["waited_ms"] < 5 and ideal["rate"] > 0
    assert contenders["pil|2.0|10.0|feedline"]["chose"] == "process"
    assert contenders["pil|2.0|10.0|feedline (threads)"]["chose"] == "thread"
    pil = [x for x in report["ratios"] if x["workload"] == "pil"][0]
    assert 0 < pil["auto_over_best_forced"] <= 1
    assert "image   " in r.stdout and "-> feedline / ideal" in r.stdout


@pytest.mark.skipif(shutil.which("spm_train") is None, reason="spm_train missing")
def test_the_text_workloads_count_real_tokens_and_match_the_ideals_steps(tmp_path):
    # 96 documents of 1-40 words, a model trained on them: 2 padded batches of 48 documents and
    # packed rows of 64 tokens, 3 rows a batch.
    rng = random.Random(0)
    words = "the of and to loader batch tensor gradient café 東京 naïve".split()
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(96)]
    (tmp_path / "corpus.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    subprocess.run(["spm_train", f"--input={tmp_path / 'corpus.txt'}",
                    f"--model_prefix={tmp_path / 'm'}", "--vocab_size=60",
                    "--hard_vocab_limit=false", "--pad_id=3", "--character_coverage=1.0",
                    "--minloglevel=2"], check=True, capture_output=True)
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "e2e_compare.py"),
                        "--data", str(tmp_path), "--text-dir", str(tmp_path),
                        "--workloads", "text,packed", "--text-docs", "96", "--text-batch", "48",
                        "--pack-rows", "3", "--seq-len", "64", "--steps", "2:10",
                        "--torch-workers", "1", "--rounds", "1", "--epochs", "2", "--quiet",
                        "--json", str(out)], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert {x["workload"] for x in report["ratios"]} == {"text", "packed"}
    contenders = report["contenders"]
    for wl in ("text", "packed"):
        ideal = contenders[f"{wl}|2.0|10.0|ideal"]
        feedline = contenders[f"{wl}|2.0|10.0|feedline"]
        assert ideal["rate"] > 0 and feedline["rate"] > 0 and feedline["chose"] == "engine"
    # The same documents whatever the contender: the tokens an epoch carries are the corpus's
    # (padding never counted), so padded and packed rates compare.
    sp = sentencepiece.SentencePieceProcessor(model_file=str(tmp_path / "m.model"))
    tokens = sum(len(sp.encode(d)) for d in docs)
    for key in ("text|2.0|10.0|ideal", "text|2.0|10.0|feedline",
                "text|2.0|10.0|torch (num_workers=1)"):
        assert contenders[key]["samples_per_epoch"] == tokens, key
    # Packed rows carry an EOS after each document.
    assert contenders["packed|2.0|10.0|feedline"]["samples_per_epoch"] == tokens + len(docs)


@pytest.mark.skipif(shutil.which("ffmpeg") is None, reason="ffmpeg missing")
def test_the_video_workload_runs_feedline_and_the_pyav_peer(tmp_path):
    pytest.importorskip("av")
    root = tmp_path / "videos"
    for c in range(2):  # 2 classes x 5 files of 2 s (H.264, B-frames): 10 clips an epoch
        (root / f"class{c}").mkdir(parents=True)
        for k in range(5):
            subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                            "testsrc2=size=96x64:rate=25", "-t", "2", "-c:v", "libx264",
                            "-bf", "2", "-pix_fmt", "yuv420p",
                            str(root / f"class{c}" / f"v{k}.mp4")], check=True)
    (root / ".complete").write_text("")  # the set is made: the benchmark does not make its own
    out = tmp_path / "e2e.json"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "e2e_compare.py"),
                        "--data", str(tmp_path), "--video-dir", str(root), "--workloads",
                        "video", "--steps", "2:10", "--torch-workers", "1", "--rounds", "1",
                        "--epochs", "2", "--quiet", "--json", str(out)],
                       capture_output=True, text=True, timeout=300, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(out.read_text())
    assert [x["workload"] for x in report["ratios"]] == ["video"]
    contenders = report["contenders"]
    for name in ("ideal", "feedline", "torch (num_workers=1)"):
        c = contenders[f"video|2.0|10.0|{name}"]
        assert c["rate"] > 0 and c["samples_per_epoch"] == 10, (name, c)


def test_the_memory_measure_counts_each_shared_memory_object_once_and_whole():
    """The benchmarks' memory figure (bench/python_compare.py's _pss; bench/process_tree.cc's
    TreePss does the same): a shared-memory object mapped by two processes counts once, and one
    held open but mapped by none (torch's batch between its worker and the loop) counts too."""
    import mmap
    sys.path.insert(0, os.path.join(ROOT, "bench"))
    from python_compare import _pss
    mib = 1 << 20
    base = _pss([os.getpid()])
    shared = os.memfd_create("test-shared")
    os.ftruncate(shared, 16 * mib)
    mapped = mmap.mmap(shared, 16 * mib)
    # Written a MiB at a time: a 16 MiB temporary could stay in this process's heap (glibc keeps
    # freed blocks once earlier tests raised its mmap threshold) and count as this test's.
    block = b"x" * mib
    for o in range(0, 16 * mib, mib):
        mapped[o:o + mib] = block  # mapped here, and in the child (inherited)
    ready_r, ready_w = os.pipe()
    done_r, done_w = os.pipe()
    pid = os.fork()
    if pid == 0:  # only os and mmap here: the child of a process with threads
        held = os.memfd_create("test-held")
        os.ftruncate(held, 32 * mib)
        m = mmap.mmap(held, 32 * mib)
        for o in range(0, 32 * mib, mib):
            m[o:o + mib] = block
        m.close()  # written, then mapped by no process; the descriptor keeps it
        _ = mapped[::4096]  # the inherited mapping's pages are in the child's page table too
        os.write(ready_w, b"1")
        os.read(done_r, 1)
        os._exit(0)
    try:
        assert os.read(ready_r, 1) == b"1"
        grew = (_pss([os.getpid(), pid]) - base) / mib
    finally:
        os.write(done_w, b"1")
        os.waitpid(pid, 0)
        mapped.close()
        for fd in (shared, ready_r, ready_w, done_r, done_w):
            os.close(fd)
    assert 44 < grew < 56, f"{grew:.1f} MiB for 16 MiB mapped by two processes and 32 MiB held"
