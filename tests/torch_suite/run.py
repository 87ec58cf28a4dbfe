"""torch's own DataLoader test suite against feedline.DataLoader.

test/test_dataloader.py of torch 1.13.1 (from Debian's source package of python3-torch, fetched
here and never committed) runs twice: with torch's DataLoader, then with feedline.DataLoader
swapped in for it in every process (swap/sitecustomize.py). Every test that passes with torch's
loader must pass with feedline's, except those in known_differences.txt (each with why); a
listed test that passes with feedline's fails the run too, so that the list only shrinks.

The torch pass takes ~16 minutes on 2 cores; its outcome on this kind of machine is kept in
torch_baseline.txt (made by --write-baseline, which runs it), and CI reads it from there
(--baseline) instead of running it again. Run both passes with no option.

Usage: /usr/bin/python3 tests/torch_suite/run.py BUILD_DIR [--baseline FILE | --write-baseline FILE]
  FEEDLINE_TORCH_SUITE_CACHE: where the source tarball is kept (default BUILD_DIR/torch-suite).
"""
import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request

URL = "http://deb.debian.org/debian/pool/main/p/pytorch/pytorch_1.13.1+dfsg.orig.tar.xz"
SHA256 = "d0355588b8528566d477e6ebf1b4d9d036a6fd75711339f66b27472ce5879dc7"
HERE = os.path.dirname(os.path.abspath(__file__))


def fetch(cache):
    os.makedirs(cache, exist_ok=True)
    path = os.path.join(cache, os.path.basename(URL))

    def ok():
        if not os.path.exists(path):
            return False
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest() == SHA256
    if not ok():
        print("== fetching torch 1.13.1's sources (Debian's orig tarball, 18 MB)", flush=True)
        for attempt in range(3):
            try:
                urllib.request.urlretrieve(URL, path + ".part")
                os.replace(path + ".part", path)
                break
            except OSError:
                if attempt == 2:
                    raise
                time.sleep(5)
        if not ok():
            raise SystemExit(f"{path}: not the expected tarball (sha256)")
    return path


def run(label, work, build, swap, timeout, python):
    results = os.path.join(work, label + ".tsv")
    env = dict(os.environ)
    paths = ([os.path.join(HERE, "swap")] if swap else []) + [HERE, os.path.join(build, "python")]
    env["PYTHONPATH"] = os.pathsep.join(paths)
    log = open(os.path.join(work, label + ".log"), "w")
    start = time.monotonic()
    def lines():
        return sum(1 for _ in open(results)) if os.path.exists(results) else 0
    for _ in range(200):  # a new runner after each hang or crash, while it makes progress
        before = lines()
        rc = subprocess.call([python, os.path.join(HERE, "runner.py"), "--results", results,
                              "--timeout", str(timeout)], cwd=work, env=env, stdout=log,
                             stderr=log)
        if rc == 0 or lines() == before:
            break
    outcomes = {}
    if not os.path.exists(results):
        raise SystemExit(f"{label}: the runner recorded nothing (see {log.name})")
    with open(results) as f:
        for line in f:
            name, outcome = line.split()
            outcomes[name] = outcome  # the last line of a test wins (CRASH is replaced)
    counts = {}
    for o in outcomes.values():
        counts[o] = counts.get(o, 0) + 1
    print(f"{label}: {len(outcomes)} tests in {time.monotonic() - start:.0f} s: "
          + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), flush=True)
    return outcomes


def known_differences():
    known = {}
    with open(os.path.join(HERE, "known_differences.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                known[line.split()[0]] = line
    return known


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--timeout", type=float, default=120, help="seconds per test")
    p.add_argument("--keep", action="store_true", help="keep the work folder (logs)")
    p.add_argument("--baseline", help="torch's outcomes from this file (not run again)")
    p.add_argument("--write-baseline", help="run torch's pass only and write its outcomes here")
    a = p.parse_args()
    build = os.path.abspath(a.build)
    cache = os.environ.get("FEEDLINE_TORCH_SUITE_CACHE", os.path.join(build, "torch-suite"))
    tarball = fetch(cache)
    work = tempfile.mkdtemp(prefix="feedline-torch-suite-")
    try:
        with tarfile.open(tarball) as t:
            member = t.getmember("pytorch-1.13.1/test/test_dataloader.py")
            with t.extractfile(member) as src, open(os.path.join(work, "test_dataloader.py"),
                                                    "wb") as dst:
                shutil.copyfileobj(src, dst)
        python = sys.executable
        if a.baseline:
            with open(a.baseline) as f:
                torch = dict(line.split() for line in f if line.strip() and line[0] != "#")
        else:
            torch = run("torch", work, build, False, a.timeout, python)
        if a.write_baseline:
            with open(a.write_baseline, "w") as f:
                f.write("# torch 1.13.1's test_dataloader.py with torch's own DataLoader, on 2 "
                        "cores (tests/torch_suite/run.py BUILD --write-baseline FILE)\n")
                for name, outcome in sorted(torch.items()):
                    f.write(f"{name} {outcome}\n")
            return 0
        feedline = run("feedline", work, build, True, a.timeout, python)
        known = known_differences()
        bad = []
        for name, outcome in sorted(torch.items()):
            if outcome != "ok":
                continue
            got = feedline.get(name, "not run")
            if got != "ok" and name not in known:
                bad.append(f"{name}: passes with torch's DataLoader, {got} with feedline's")
            elif got == "ok" and name in known:
                bad.append(f"{name}: passes with feedline's DataLoader now: take it off "
                           "known_differences.txt")
        passing = sum(1 for n, o in torch.items() if o == "ok")
        same = sum(1 for n, o in torch.items() if o == "ok" and feedline.get(n) == "ok")
        print(f"feedline passes {same} of the {passing} tests torch's DataLoader passes here; "
              f"{len(known)} known differences listed", flush=True)
        for line in bad:
            print("FAIL:", line)
        if bad:
            with open(os.path.join(work, "feedline.log")) as f:
                print("--- feedline's log, last 300 lines\n" + "".join(f.readlines()[-300:]))
        return 1 if bad else 0
    finally:
        if a.keep:
            print("work folder:", work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
