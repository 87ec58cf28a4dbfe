"""bench/e2e_compare.py (`feedline-bench --e2e`) runs end to end on a small folder: every
contender in its own process, the ideal loop, feedline's loaders and torch's DataLoader inside
the simulated training step, and the ratios it reports. A smoke test of the harness (its
figures are the benchmark's, not a test's: this machine's speed varies)."""

import json
import os
import subprocess
import sys

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
    assert "image   " in r.stdout and "-> feedline / ideal" in r.stdout
