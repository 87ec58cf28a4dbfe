"""Remote storage over the S3 API: s3rver (npm, installed into tests/s3 by
cmake/install-deps.sh) on loopback, objects uploaded with curl's own SigV4 signing. An
ImageFolder-like prefix and a list file of keys give the local folder's samples, order and
pixels; credentials come from the environment or ~/.aws files; a missing key and an unknown
access key are DataErrors that name the object and never the secret."""

import os
import shutil
import socket
import subprocess
import time

import pytest
import torch

import feedline
from util import write_tar

HERE = os.path.dirname(os.path.abspath(__file__))
S3RVER = os.path.join(HERE, "..", "s3", "node_modules", ".bin", "s3rver")
CURL = shutil.which("curl")
pytestmark = pytest.mark.skipif(
    not os.path.exists(S3RVER) or CURL is None,
    reason="s3rver or curl missing (cmake/install-deps.sh installs them)")

KEY, SECRET = "S3RVER", "S3RVER"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _put(endpoint, bucket, key, path):
    subprocess.run([CURL, "-sf", "-o", "/dev/null", "-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD",
                    "--aws-sigv4", "aws:amz:us-east-1:s3", "--user", f"{KEY}:{SECRET}",
                    "-T", str(path), f"{endpoint}/{bucket}/{key}"], check=True)


@pytest.fixture(scope="module")
def s3(tmp_path_factory, small_folder):
    d = tmp_path_factory.mktemp("s3rver")
    port = _free_port()
    proc = subprocess.Popen([S3RVER, "-d", str(d), "-a", "127.0.0.1", "-p", str(port), "-s",
                             "--configure-bucket", "bkt"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        end = time.time() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                if time.time() > end:
                    raise
                time.sleep(0.1)
        entries = []
        for label, cls in enumerate(sorted(os.listdir(small_folder))):
            for name in sorted(os.listdir(os.path.join(small_folder, cls))):
                _put(endpoint, "bkt", f"train/{cls}/{name}", os.path.join(small_folder, cls, name))
                entries.append((f"{cls}/{name}", label))
        lst = d / "list.txt"
        lst.write_text("".join(f"train/{p} {lab}\n" for p, lab in entries))
        _put(endpoint, "bkt", "list.txt", lst)
        yield dict(endpoint=endpoint, entries=entries)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def aws_env(s3, monkeypatch, tmp_path):
    for k in list(os.environ):
        if k.startswith("AWS_"):
            monkeypatch.delenv(k)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.aws of the machine's
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3["endpoint"])
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return monkeypatch


def _epoch(loader):
    xs, ys, ids = zip(*loader)
    return torch.cat(xs), torch.cat(ys), torch.cat(ids)


KW = dict(batch_size=4, transform="eval", size=64, resize_size=72, shuffle=False,
          return_index=True)


def test_prefix_is_an_image_folder_with_the_local_order(aws_env, small_folder):
    local_loader = feedline.ImageLoader(small_folder, **KW)
    remote_loader = feedline.ImageLoader("s3://bkt/train/", workers=2, **KW)
    assert remote_loader.classes == local_loader.classes
    assert [os.path.relpath(p, small_folder) for p, _ in local_loader.samples] == \
        [p[len("s3://bkt/train/"):] for p, _ in remote_loader.samples]
    for a, b in zip(_epoch(local_loader), _epoch(remote_loader)):
        assert torch.equal(a, b)
    remote = remote_loader.stats()["remote"]
    assert remote["requests"] >= len(local_loader.samples) and remote["failures"] == 0


def test_list_file_of_keys(aws_env, small_folder):
    local = _epoch(feedline.ImageLoader(small_folder, **KW))
    for a, b in zip(local, _epoch(feedline.ImageLoader("s3://bkt/list.txt", **KW))):
        assert torch.equal(a, b)


def test_credentials_from_aws_files(aws_env, tmp_path, small_folder):
    aws_env.delenv("AWS_ACCESS_KEY_ID")
    aws_env.delenv("AWS_SECRET_ACCESS_KEY")
    aws_env.delenv("AWS_REGION")
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "credentials").write_text(
        f"[default]\naws_access_key_id = NOPE\naws_secret_access_key = x\n"
        f"[lab]\naws_access_key_id = {KEY}\naws_secret_access_key = {SECRET}\n")
    (tmp_path / ".aws" / "config").write_text("[profile lab]\nregion = us-east-1\n")
    aws_env.setenv("AWS_PROFILE", "lab")
    assert len(list(feedline.ImageLoader("s3://bkt/list.txt", **KW))) == 7
    # The default profile's key is unknown to the server: a clear error, no secret in it.
    aws_env.setenv("AWS_PROFILE", "default")
    with pytest.raises(PermissionError, match="s3://bkt/list.txt.*403.*InvalidAccessKeyId"):
        feedline.ImageLoader("s3://bkt/list.txt", **KW)


def test_missing_key_and_bad_credentials_are_clear(aws_env, tmp_path):
    with pytest.raises(FileNotFoundError, match="s3://bkt/nope.txt.*404.*end the source with"):
        feedline.ImageLoader("s3://bkt/nope.txt", **KW)
    lst = tmp_path / "l.txt"
    lst.write_text("s3://bkt/train/x/00.jpg 0\ns3://bkt/train/x/missing.jpg 0\n")
    with pytest.raises(feedline.DataError, match="s3://bkt/train/x/missing.jpg: HTTP 404"):
        list(feedline.ImageLoader(str(lst), batch_size=1, shuffle=False))
    aws_env.setenv("AWS_ACCESS_KEY_ID", "UNKNOWN")
    aws_env.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")
    with pytest.raises(feedline.DataError) as e:
        list(feedline.ImageLoader(str(lst), batch_size=1, shuffle=False))
    assert "403" in str(e.value) and "InvalidAccessKeyId" in str(e.value)
    assert "s3cr3t-value" not in str(e.value)


def _shard_members(folder, entries, key):
    """(name, bytes) of key.jpg + key.cls for each (relative path, label) of `entries`; `key`
    formats the sample's number."""
    return [(f"{key.format(j)}.{ext}", blob) for j, (p, lab) in enumerate(entries)
            for ext, blob in (("jpg", open(os.path.join(folder, p), "rb").read()),
                              ("cls", str(lab).encode()))]


def test_webdataset_shard_on_s3(aws_env, tmp_path, small_folder, s3):
    shard = tmp_path / "one.tar"
    write_tar(shard, _shard_members(small_folder, s3["entries"], "k{:03d}"))
    _put(s3["endpoint"], "bkt", "shards/one.tar", shard)
    aws_env.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    local = _epoch(feedline.ImageLoader(str(shard), **KW))
    remote = feedline.ImageLoader("s3://bkt/shards/one.tar", **KW)
    assert remote.samples[0][0] == "s3://bkt/shards/one.tar:k000.jpg"
    for a, b in zip(local, _epoch(remote)):
        assert torch.equal(a, b)


def test_shards_by_range_over_s3(aws_env, s3, small_folder, tmp_path):
    """WebDataset shards as S3 objects with a cache budget of 0: downloaded once (signed) to be
    catalogued, then every sample is a signed range request; the local pixels."""
    members = _shard_members(small_folder, s3["entries"], "{:04d}")
    for k in range(2):
        shard = tmp_path / f"s-{k}.tar"
        # Samples alternately in the two shards (two members each: jpg, cls).
        write_tar(shard, [m for j, m in enumerate(members) if j // 2 % 2 == k])
        _put(s3["endpoint"], "bkt", f"shards/s-{k}.tar", shard)
    aws_env.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    aws_env.setenv("FEEDLINE_SHARD_CACHE_BYTES", "0")
    # Requests counted for one epoch: no head start of the next (its reads would be counted).
    aws_env.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    local = _epoch(feedline.ImageLoader(str(tmp_path / "s-{0..1}.tar"), **KW))
    remote = feedline.ImageLoader("s3://bkt/shards/s-{0..1}.tar", **KW)
    for a, b in zip(local, _epoch(remote)):
        assert torch.equal(a, b)
    assert remote.stats()["remote"]["requests"] == len(s3["entries"])
    assert not [n for n in os.listdir(tmp_path / "cache" / "shards") if n.endswith(".tar")]
