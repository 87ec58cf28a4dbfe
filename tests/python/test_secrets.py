"""No credential reaches any output: every way a URL can come back as text — errors (404, 403,
a dead endpoint, a missing shard, a bad or cross-host list file, text and token sources),
skip warnings, stats(), repr(), samples, root — for URLs that carry a password and presigned
query parameters, in a process of its own whose whole stdout and stderr (C++ logging included)
are searched for every byte sequence of the secrets."""

import os
import subprocess
import sys

import pytest

import util

HERE = os.path.dirname(os.path.abspath(__file__))
SERVERS = os.path.join(os.path.dirname(HERE), "servers")
PASSWORD = "s3cr3tPW"
ODD_PASSWORD = "s3cr3tPW/x?y#z"  # characters that end a URL's parts when unencoded
SIGNATURE = "SIGabc123def456"
CREDENTIAL = "AKIAFAKECRED777"

SCENARIOS = r"""
import json, os, sys, warnings
sys.path.insert(0, sys.argv[3])
import nginx
import feedline

root, work = sys.argv[1], sys.argv[2]
password, signature, credential, odd = sys.argv[4:8]
out = []


def run(name, f):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            for line in f():
                out.append(f"{name}: {line}")
        except Exception as e:  # the message is what is checked
            out.append(f"{name}: {type(e).__name__}: {e}")
    out.extend(f"{name}: warning: {w.message}" for w in caught)


def everything(loader, epochs=1):
    for _ in range(epochs):
        for _ in loader:
            pass
    yield repr(loader)
    yield json.dumps(loader.stats(), default=str)
    for attr in ("samples", "root"):  # (`source` is the argument as the user gave it)
        if hasattr(loader, attr):
            yield repr(getattr(loader, attr))


with nginx.serve(root, work, locations="location /secret/ { return 403; }") as (base, _):
    auth = base.replace("http://", f"http://user:{password}@")
    query = f"?X-Amz-Signature={signature}&X-Amz-Credential={credential}"
    kw = dict(batch_size=2, size=32, resize_size=32, transform="eval", shuffle=False)
    run("remote list", lambda: everything(feedline.ImageLoader(auth + "/list.txt" + query,
                                                                on_error="skip", **kw)))
    local = os.path.join(work, "urls.txt")
    with open(local, "w") as f:
        f.write(f"{auth}/data/a/0.jpg{query} 0\n{auth}/missing.jpg{query} 1\n"
                f"{auth}/secret/x.jpg{query} 1\n{auth}/data/a/1.jpg{query} 0\n")
    run("404/403 raise", lambda: everything(feedline.ImageLoader(local, **kw)))
    run("404/403 skip", lambda: everything(feedline.ImageLoader(local, on_error="skip", **kw),
                                           epochs=2))
    dead = os.path.join(work, "dead.txt")
    with open(dead, "w") as f:
        f.write(f"http://user:{password}@127.0.0.1:{nginx.free_port()}/a.jpg{query} 0\n"
                f"http://user:{odd}@127.0.0.1:{nginx.free_port()}/b.jpg{query} 0\n")
    run("dead endpoint", lambda: everything(feedline.ImageLoader(dead, read_timeout=2,
                                                                 on_error="skip", **kw)))
    run("shards", lambda: everything(feedline.ImageLoader(auth + "/shards/train-{000..001}.tar",
                                                           on_error="skip", **kw)))
    run("missing shard", lambda: everything(feedline.ImageLoader(
        auth + "/shards/nothere-{000..001}.tar", **kw)))
    run("bad list", lambda: everything(feedline.ImageLoader(auth + "/bad.txt" + query, **kw)))
    run("cross-host list", lambda: everything(feedline.ImageLoader(auth + "/cross.txt" + query,
                                                                    **kw)))
    run("text", lambda: everything(feedline.TextLoader(auth + "/missing.txt" + query,
                                                       tokenizer=auth + "/m.model" + query)))
    run("tokens", lambda: everything(feedline.TokenLoader(auth + "/missing.bin" + query,
                                                          seq_len=8)))
print("\n".join(out))
"""


def test_no_password_or_signature_in_any_output(tmp_path, small_folder):
    import shutil
    root = tmp_path / "root"
    shutil.copytree(small_folder, root / "data")
    os.rename(root / "data" / "x", root / "data" / "a")
    for i, name in enumerate(sorted(os.listdir(root / "data" / "a"))):
        os.rename(root / "data" / "a" / name, root / "data" / "a" / f"{i}.jpg")
    (root / "list.txt").write_text("data/a/0.jpg 0\ndata/y/00.jpg 1\ndata/a/missing.jpg 0\n")
    (root / "bad.txt").write_text("data/a/0.jpg zero\n")
    (root / "cross.txt").write_text("/etc/hostname 0\n")
    (root / "shards").mkdir()
    blob = (root / "data" / "a" / "0.jpg").read_bytes()
    util.write_tar(root / "shards" / "train-000.tar", [("k0.jpg", blob), ("k0.cls", b"0"),
                                                        ("k1.jpg", b"broken"), ("k1.cls", b"1")])
    util.write_tar(root / "shards" / "train-001.tar", [("k2.jpg", blob), ("k2.cls", b"1")])
    env = dict(os.environ, FEEDLINE_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", SCENARIOS, str(root), str(tmp_path), SERVERS,
                        PASSWORD, SIGNATURE, CREDENTIAL, ODD_PASSWORD], capture_output=True,
                       text=True,
                       timeout=300, env=env)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text[-4000:]
    # The scenarios ran and reached the paths they are about.
    for expect in ("remote list: feedline.ImageLoader", "HTTP 404", "HTTP 403", "dead endpoint: ",
                   "missing shard: ", "bad list: ", "cross-host list: ", "text: ", "tokens: ",
                   "train-000.tar:k1.jpg",
                   "404/403 skip: warning:", "127.0.0.1"):
        assert expect in text, (expect, text[-4000:])
    for secret in (PASSWORD, SIGNATURE, CREDENTIAL, "s3cr3t", "SIGabc", "AKIAFAKE",
                   "X-Amz-Signature", "user:"):
        assert secret not in text, (secret, [l for l in text.splitlines() if secret in l][:5])
