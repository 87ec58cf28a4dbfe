"""Remote storage over HTTP: real servers on loopback only. nginx (Debian's, installed by
cmake/install-deps.sh) serves an image folder; a small proxy of this file's own sits in front
of it to add latency, answer 503 and reset connections; a server that accepts and never
answers, and a port nobody listens on, stand for a hung and a dead endpoint. Every sample must
arrive once with the bytes of the local file, and every failure must be a clear error within
read_timeout."""

import http.client
import json
import http.server
import os
import random
import socket
import shutil
import struct
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch

import feedline

import nginx  # tests/servers/nginx.py (on the path by conftest.py)
import util
from util import write_tar

pytestmark = pytest.mark.skipif(nginx.NGINX is None,
                                reason="nginx missing (cmake/install-deps.sh)")


def _free_port():
    return nginx.free_port()


@pytest.fixture(scope="module")
def served(tmp_path_factory, small_folder):
    """nginx serving small_folder and list files of it; yields (base URL, local list file)."""
    d = tmp_path_factory.mktemp("nginx")
    root = d / "root"
    shutil.copytree(small_folder, root / "data")
    (root / "secret").mkdir()
    (root / "secret" / "x.jpg").write_bytes(b"\xff\xd8")
    entries = []
    for label, cls in enumerate(sorted(os.listdir(root / "data"))):
        for name in sorted(os.listdir(root / "data" / cls)):
            entries.append((f"data/{cls}/{name}", label))
    (root / "list.txt").write_text("".join(f"{p} {lab}\n" for p, lab in entries))
    # WebDataset shards of the same images (key.jpg + key.cls), 3 shards.
    (root / "shards").mkdir()
    for k in range(3):
        write_tar(root / "shards" / f"train-{k:03d}.tar",
                  [(f"s{j:04d}.{ext}", blob) for j, (p, lab) in enumerate(entries) if j % 3 == k
                   for ext, blob in (("jpg", (root / p).read_bytes()), ("cls", str(lab).encode()))])
    local = d / "local.txt"
    local.write_text("".join(f"{root}/{p} {lab}\n" for p, lab in entries))
    with nginx.serve(root, d / "nginx", locations="location /secret/ { return 403; }") as (
            base, _):
        yield dict(base=base, port=int(base.rsplit(":", 1)[1]), local=str(local), root=root,
                   entries=entries, shards=str(root / "shards" / "train-{000..002}.tar"))


class _FaultProxy(http.server.ThreadingHTTPServer):
    """Forwards GETs to `upstream`, after `latency` s; a share `fail` of requests (by a seeded
    RNG) gets a 503 or a connection reset instead. `etag=False`: a server that sends no ETag
    (Last-Modified only)."""
    daemon_threads = True

    def __init__(self, upstream_port, latency=0.0, fail=0.0, seed=0, etag=True, trickle=0.0):
        self.upstream_port, self.latency, self.fail = upstream_port, latency, fail
        self.etag, self.trickle = etag, trickle  # trickle: s between 4 KiB pieces of a body
        self.rng, self.lock = random.Random(seed), threading.Lock()
        self.requests, self.injected, self.heads, self.gets = 0, 0, 0, 0
        super().__init__(("127.0.0.1", 0), _ProxyHandler)


class _ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        srv = self.server
        with srv.lock:
            srv.requests += 1
            srv.gets += 1
            fault = srv.rng.random() < srv.fail
            reset = srv.rng.random() < 0.5
            srv.injected += fault
        if srv.latency:
            time.sleep(srv.latency)
        if fault and reset:  # an abrupt close: the client sees a reset
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        if fault:
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        up = http.client.HTTPConnection("127.0.0.1", srv.upstream_port, timeout=10)
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() in ("range", "if-match", "if-unmodified-since")}
        up.request("GET", self.path, headers=headers)
        r = up.getresponse()
        body = r.read()
        up.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() in ("content-type", "content-range", "accept-ranges", "last-modified") \
                    or (k.lower() == "etag" and srv.etag):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not srv.trickle:
            self.wfile.write(body)
            return
        try:
            for at in range(0, len(body), 4096):
                self.wfile.write(body[at:at + 4096])
                self.wfile.flush()
                time.sleep(srv.trickle)
        except OSError:  # the client went away (killed mid-download)
            self.close_connection = True

    def do_HEAD(self):  # forwarded as it is (the shard cache's version check), counted
        srv = self.server
        with srv.lock:
            srv.requests += 1
            srv.heads += 1
        up = http.client.HTTPConnection("127.0.0.1", srv.upstream_port, timeout=10)
        up.request("HEAD", self.path)
        r = up.getresponse()
        r.read()
        up.close()
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() in ("content-length", "content-type", "last-modified") \
                    or (k.lower() == "etag" and srv.etag):
                self.send_header(k, v)
        self.end_headers()


@pytest.fixture
def proxy(served):
    started = []

    def start(**kw):
        p = _FaultProxy(served["port"], **kw)
        threading.Thread(target=p.serve_forever, daemon=True).start()
        started.append(p)
        return p, f"http://127.0.0.1:{p.server_address[1]}"

    yield start
    for p in started:
        p.shutdown()
        p.server_close()


def _epoch(loader):
    images, labels, index = [], [], []
    for x, y, i in loader:
        images.append(x)
        labels.append(y)
        index.append(i)
    return torch.cat(images), torch.cat(labels), torch.cat(index)


KW = dict(batch_size=5, transform="eval", size=64, resize_size=72, shuffle=False,
          return_index=True)


def test_list_file_by_url_gives_the_local_bytes(served):
    local = _epoch(feedline.ImageLoader(served["local"], **KW))
    remote = feedline.ImageLoader(served["base"] + "/list.txt", workers=2, **KW)
    got = _epoch(remote)
    for a, b in zip(local, got):
        assert torch.equal(a, b)
    assert len(got[2]) == len(served["entries"])
    # The same through a local list file of absolute URLs.
    urls = served["root"].parent / "urls.txt"
    urls.write_text("".join(f"{served['base']}/{p} {lab}\n" for p, lab in served["entries"]))
    for a, b in zip(local, _epoch(feedline.ImageLoader(str(urls), **KW))):
        assert torch.equal(a, b)


def test_a_remote_list_file_names_only_its_own_servers_files(served, monkeypatch, tmp_path):
    """A list file fetched from a server may name that server's files (relative paths, or URLs
    of its scheme and host), nothing else: a local absolute path (it read /etc/hostname), another
    host or an s3:// object (signed with the user's credentials) is refused when the loader
    opens, naming the list and the entry, without the list URL's password. A user who trusts
    the list allows others with FEEDLINE_LIST_ANY_HOST=1."""
    base, root = served["base"], served["root"]
    same = f"{base}/data/{served['entries'][0][0].split('/', 1)[1]}"
    lists = {
        "local.txt": ("/etc/hostname 0\n", "a local path"),
        "other_host.txt": (f"http://localhost:{served['port']}/{served['entries'][0][0]} 0\n",
                           "on another host"),
        "s3.txt": ("s3://bucket/key.jpg 0\n", "on another host"),
        "dot_slash.txt": ("//evil.example/x.jpg 0\n", "a local path"),
    }
    for name, (text, why) in lists.items():
        (root / name).write_text(f"{served['entries'][0][0]} 0\n" + text)
    auth = base.replace("http://", "http://user:s3cret@")
    for name, (_, why) in lists.items():
        with pytest.raises(ValueError, match=rf"{name}: sample 2 .*is {why}") as e:
            feedline.ImageLoader(f"{auth}/{name}", **KW)
        assert "s3cret" not in str(e.value)
    (root / "ok.txt").write_text(f"{served['entries'][0][0]} 0\n{same} 1\n")
    assert len(_epoch(feedline.ImageLoader(f"{base}/ok.txt", **KW))[2]) == 2
    monkeypatch.setenv("FEEDLINE_LIST_ANY_HOST", "1")
    loader = feedline.ImageLoader(f"{base}/other_host.txt", **KW)
    assert len(_epoch(loader)[2]) == 2


def test_faults_and_latency_lose_nothing(served, proxy, monkeypatch):
    """20 ms added per request, and 1 request in 5 answered 503 or reset: every sample arrives
    once, with the local pixels."""
    # Requests counted for one epoch: no head start of the next (its reads would be in flight).
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    local = _epoch(feedline.ImageLoader(served["local"], **KW))
    p, base = proxy(latency=0.02, fail=0.2, seed=5)
    loader = feedline.ImageLoader(base + "/list.txt", **KW)
    got = _epoch(loader)
    assert sorted(got[2].tolist()) == list(range(len(served["entries"])))
    for a, b in zip(local, got):
        assert torch.equal(a, b)
    assert p.injected > 3  # the faults did happen (and were retried)
    remote = loader.stats()["remote"]
    # libcurl itself retries a request once when a reused connection turns out dead, so some
    # resets never reach the loader's retry count.
    assert remote["retries"] >= 1 and remote["failures"] == 0 and remote["in_flight"] == 0
    assert len(served["entries"]) <= remote["requests"] < p.requests
    assert remote["request_ms"] >= 20


def test_bytes_cache_fetches_each_url_once(served):
    """cache="bytes" over HTTP: later epochs are served from memory (no request), same pixels."""
    loader = feedline.ImageLoader(served["base"] + "/list.txt", cache="bytes", **KW)
    first = _epoch(loader)
    requests = loader.stats()["remote"]["requests"]
    assert requests == len(served["entries"])
    again = _epoch(loader)
    for a, b in zip(first, again):
        assert torch.equal(a, b)
    assert loader.stats()["remote"]["requests"] == requests


def test_https_with_a_private_ca(served, tmp_path, monkeypatch):
    """HTTPS from nginx with a self-signed certificate: refused (clearly, at once) until its CA
    is named by CURL_CA_BUNDLE, then the local pixels."""
    cert, key = nginx.self_signed_cert(tmp_path / "tls")
    for var in ("CURL_CA_BUNDLE", "SSL_CERT_FILE", "AWS_CA_BUNDLE"):
        monkeypatch.delenv(var, raising=False)
    with nginx.serve(served["root"], tmp_path / "nginx", tls=(cert, key)) as (base, _):
        assert base.startswith("https://")
        t0 = time.time()
        with pytest.raises(ConnectionError, match=rf"{base}/list.txt: .*certificate"):
            feedline.ImageLoader(base + "/list.txt", **KW)
        assert time.time() - t0 < 5  # not retried
        monkeypatch.setenv("CURL_CA_BUNDLE", cert)
        local = _epoch(feedline.ImageLoader(served["local"], **KW))
        for a, b in zip(local, _epoch(feedline.ImageLoader(base + "/list.txt", **KW))):
            assert torch.equal(a, b)


def test_a_forked_child_reads_urls_with_its_own_http_loop(served):
    """The HTTP event loop is per process: a child forked after the parent read URLs (its loop
    thread running) makes its own, and reads every sample."""
    n = len(_epoch(feedline.ImageLoader(served["base"] + "/list.txt", **KW))[2])
    pid = os.fork()
    if pid == 0:  # the child: exit code 0 when it read every sample
        code = 1
        try:
            got = _epoch(feedline.ImageLoader(served["base"] + "/list.txt", **KW))
            code = 0 if len(got[2]) == n else 2
        finally:
            os._exit(code)
    deadline = time.time() + 60
    while time.time() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung reading URLs")
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_an_empty_member_read_by_range_is_empty(served, tmp_path, monkeypatch):
    """A key whose image member has no bytes, in a shard read by range: its sample fails as
    from the local shard (no image), never with the bytes of the record read before it."""
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", "0")
    data = (served["root"] / served["entries"][0][0]).read_bytes()
    shard = served["root"] / "shards" / "empty-member.tar"
    members = [(f"a{k:02d}.{ext}", blob) for k in range(12)
               for ext, blob in (("jpg", data), ("cls", b"0"))]  # read buffers get reused
    write_tar(shard, members + [("b.jpg", b""), ("b.cls", b"0")])
    kw = dict(batch_size=1, shuffle=False, workers=1, io_depth=2, transform="eval", size=64,
              resize_size=72)
    try:
        for source in (str(shard), served["base"] + "/shards/empty-member.tar"):
            batches = iter(feedline.ImageLoader(source, **kw))
            for _ in range(12):
                next(batches)
            with pytest.raises(feedline.DataError, match=r"b\.jpg"):
                next(batches)
    finally:
        shard.unlink()


def test_missing_and_forbidden_urls_are_data_errors(served, tmp_path):
    lst = tmp_path / "l.txt"
    good = f"{served['base']}/{served['entries'][0][0]}"
    lst.write_text(f"{good} 0\n{served['base']}/data/nope.jpg 1\n"
                   f"http://user:hunter2@127.0.0.1:{served['port']}/secret/x.jpg?sig=abc 0\n")
    t = time.time()
    with pytest.raises(feedline.DataError) as e:
        list(feedline.ImageLoader(str(lst), batch_size=1, shuffle=False))
    assert "data/nope.jpg" in str(e.value) and "404" in str(e.value)
    assert time.time() - t < 5  # not retried
    skip = feedline.ImageLoader(str(lst), batch_size=1, shuffle=False, on_error="skip",
                                max_errors=10)
    list(skip)
    errors = [x["path"] + ": " + x["cause"] for x in skip.stats()["errors"]]
    assert any("403" in m and "/secret/x.jpg" in m for m in errors), errors
    assert not any("hunter2" in m or "sig=abc" in m for m in errors), errors


def test_skip_says_every_remote_sample_it_replaced(served, tmp_path, monkeypatch):
    """on_error="skip" over remote faults: a 404 and a 403 (not retried) and an endpoint that
    refuses every attempt until the retries run out. Each epoch keeps its full batches, and what
    that costs is never silent: one warning per epoch naming the count and the first cause, each
    failed URL in stats()["errors"], and exactly as many duplicates as failures."""
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")  # errors counted per epoch
    dead = _free_port()  # nobody listens there
    entries = served["entries"]
    bad = {2: f"{served['base']}/data/nope.jpg", 5: f"{served['base']}/secret/x.jpg",
           7: f"http://127.0.0.1:{dead}/gone.jpg"}
    lst = tmp_path / "l.txt"
    lst.write_text("".join(f"{bad.get(i, served['base'] + '/' + p)} {lab}\n"
                           for i, (p, lab) in enumerate(entries)))
    loader = feedline.ImageLoader(str(lst), on_error="skip", max_errors=100, read_timeout=2,
                                  **KW)
    for epoch in range(2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            _, _, index = _epoch(loader)
        said = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        assert len(said) == 1 and "3 sample(s) failed this epoch" in said[0], (epoch, said)
        got = index.tolist()
        assert len(got) == len(entries)  # full batches
        assert not set(got) & set(bad), got  # no failed sample delivered
        assert len(got) - len(set(got)) == len(bad)  # a duplicate per failure, no more
        assert set(got) == set(range(len(entries))) - set(bad)  # nothing else lost
    st = loader.stats()
    assert st["error_count"] == 2 * len(bad)
    paths = " ".join(e["path"] + ": " + e["cause"] for e in st["errors"])
    for want in ("nope.jpg", "/secret/x.jpg", f"127.0.0.1:{dead}/gone.jpg"):
        assert want in paths, paths


def test_dead_endpoint_fails_in_seconds(tmp_path):
    port = _free_port()  # nobody listens there
    lst = tmp_path / "l.txt"
    lst.write_text(f"http://127.0.0.1:{port}/a.jpg 0\n")
    t = time.time()
    with pytest.raises(feedline.DataError, match=f"127.0.0.1:{port}/a.jpg"):
        list(feedline.ImageLoader(str(lst), batch_size=1))
    assert time.time() - t < 15


def test_hung_server_times_out_within_read_timeout(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held = []

    def accept():  # accepts and never answers
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    lst = tmp_path / "l.txt"
    lst.write_text(f"http://127.0.0.1:{port}/a.jpg 0\n")
    t = time.time()
    try:
        with pytest.raises(feedline.DataError, match=f"127.0.0.1:{port}/a.jpg"):
            list(feedline.ImageLoader(str(lst), batch_size=1, read_timeout=2.0))
        assert time.time() - t < 10
    finally:
        listener.close()
        for c in held:
            c.close()


def test_shards_on_a_hung_server_fail_within_a_few_read_timeouts(tmp_path, monkeypatch):
    """WebDataset shards on an endpoint that accepts connections and never answers: the open
    fails within a small multiple of read_timeout, however many shards (before: each shard's 6
    attempts, shard after shard, 165 s for read_timeout=5), naming a shard."""
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    held = []

    def accept():
        while True:
            try:
                held.append(listener.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    port = listener.getsockname()[1]
    try:
        t = time.time()
        with pytest.raises(OSError, match=rf"127.0.0.1:{port}/train-0\d\d.tar: no answer"):
            feedline.ImageLoader(f"http://127.0.0.1:{port}/train-{{000..011}}.tar",
                                 batch_size=1, read_timeout=2.0)
        assert time.time() - t < 4 * 2.0 + 2
    finally:
        listener.close()
        for c in held:
            c.close()


def _touch_later(path):
    """A modification time in a second no earlier test gave the file: nginx's ETag (mtime in
    seconds, size) then differs for a rewrite of the same size, however fast the tests ran."""
    t = max(time.time(), os.stat(path).st_mtime) + 60
    os.utime(path, (t, t))


def _cache_files(tmp_path):
    d = tmp_path / "cache" / "shards"
    names = sorted(os.listdir(d))
    return ([n for n in names if n.endswith(".tar")], [n for n in names if n.endswith(".idx")],
            [n for n in names if n.endswith(".part")])


def test_webdataset_shards_by_url_are_cached_locally(served, proxy, tmp_path, monkeypatch):
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FEEDLINE_SHARD_CACHE_BYTES", raising=False)
    kw = dict(KW, shuffle=True, seed=3)
    local = _epoch(feedline.ImageLoader(served["shards"], **kw))
    p, base = proxy()  # counts the requests that reach the server
    url = base + "/shards/train-{000..002}.tar"
    remote = feedline.ImageLoader(url, **kw)
    assert p.requests == 3  # one download per shard
    assert remote.samples[0][0].startswith(base + "/shards/train-000.tar:")
    for a, b in zip(local, _epoch(remote)):
        assert torch.equal(a, b)
    tars, catalogs, parts = _cache_files(tmp_path)
    assert len(tars) == 3 and len(catalogs) == 3 and not parts
    assert p.requests == 3  # the epoch read the cached copies
    # Opened again: read from the cache; the server is only asked whether each shard is
    # still the version cached (a HEAD each).
    again = feedline.ImageLoader(url, **kw)
    for a, b in zip(local, _epoch(again)):
        assert torch.equal(a, b)
    assert p.requests == 6 and p.heads == 3
    # A shard rewritten on the server (here: with its first sample only) is fetched again.
    shard = served["root"] / "shards" / "train-001.tar"
    original = shard.read_bytes()
    try:
        import io
        import tarfile
        with tarfile.open(fileobj=io.BytesIO(original)) as tar:
            first = [m for m in tar.getmembers()][:2]  # key.jpg + key.cls
            blobs = [tar.extractfile(m).read() for m in first]
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for m, blob in zip(first, blobs):
                tar.addfile(m, io.BytesIO(blob))
        shard.write_bytes(buf.getvalue())
        _touch_later(shard)
        changed = feedline.ImageLoader(url, **kw)
        assert p.requests == 6 + 3 + 1  # three HEADs, one download again
        in_shard_1 = sum(1 for j in range(len(served["entries"])) if j % 3 == 1)
        assert len(changed.samples) == len(served["entries"]) - in_shard_1 + 1
    finally:
        shard.write_bytes(original)
    with pytest.raises(FileNotFoundError, match=r"train-00[89]\.tar: HTTP 404"):
        feedline.ImageLoader(served["base"] + "/shards/train-{008..009}.tar", **kw)
    assert not _cache_files(tmp_path)[2]


def test_range_reads_from_a_server_without_etags_notice_a_changed_shard(served, proxy, tmp_path,
                                                                      monkeypatch):
    """A server that sends Last-Modified but no ETag: the catalog keeps that date, range reads
    ask for that version (If-Unmodified-Since), and a shard rewritten on the server is a clear
    DataError, never other samples' bytes at stale offsets with stale labels (before: 24 rows
    of wrong images); at the next open its HEAD notices the change and it is fetched again."""
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", "0")  # read by range
    kw = dict(KW, shuffle=False)
    local = _epoch(feedline.ImageLoader(served["shards"], **kw))
    p, base = proxy(etag=False)
    url = base + "/shards/train-{000..002}.tar"
    for a, b in zip(local, _epoch(feedline.ImageLoader(url, **kw))):
        assert torch.equal(a, b)
    shard = served["root"] / "shards" / "train-001.tar"
    original = shard.read_bytes()
    stat = os.stat(shard)
    try:
        reading = feedline.ImageLoader(url, **kw)
        shard.write_bytes(original[512:] + original[:512])  # same size, other bytes
        os.utime(shard, (stat.st_atime + 5, stat.st_mtime + 5))
        with pytest.raises(feedline.DataError, match=r"train-001\.tar: HTTP 412: the object "
                                                     r"changed since it was catalogued "
                                                     r"\(Last-Modified "):
            _epoch(reading)
    finally:
        shard.write_bytes(original)
        os.utime(shard, (stat.st_atime + 10, stat.st_mtime + 10))
    for a, b in zip(local, _epoch(feedline.ImageLoader(url, **kw))):  # fetched again
        assert torch.equal(a, b)


def test_shards_past_the_cache_budget_are_read_by_range(served, proxy, tmp_path, monkeypatch):
    """A byte budget of 0: shards are downloaded once to be catalogued, then removed; samples
    are fetched one range request each (through 503s and resets), with the local pixels."""
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", "0")
    # Requests counted for one epoch: no head start of the next (its reads would be counted).
    monkeypatch.setenv("FEEDLINE_EPOCH_HEAD_START", "0")
    kw = dict(KW, shuffle=True, seed=3)
    local = _epoch(feedline.ImageLoader(served["shards"], **kw))
    p, base = proxy(fail=0.2, seed=7)
    url = base + "/shards/train-{000..002}.tar"
    remote = feedline.ImageLoader(url, **kw)
    got = _epoch(remote)
    for a, b in zip(local, got):
        assert torch.equal(a, b)
    tars, catalogs, _ = _cache_files(tmp_path)
    assert not tars and len(catalogs) == 3
    r = remote.stats()["remote"]
    assert r["requests"] - r["retries"] == len(served["entries"]) and r["failures"] == 0
    assert p.injected > 0
    # Opened again with the catalogs there: nothing downloaded, only the samples' ranges.
    p.fail = 0.0
    before, heads = p.requests, p.heads
    again = feedline.ImageLoader(url, **dict(kw, shuffle=False))
    _epoch(again)
    assert p.heads - heads == 3  # the version check of each catalogued shard
    assert p.requests - before - 3 == again.stats()["remote"]["requests"] == len(served["entries"])
    # A shard rewritten on the server while a loader reads it by range: the reads ask for the
    # catalogued version (If-Match) and fail clearly, never return bytes at stale offsets. (At
    # open, a changed shard is noticed by its HEAD and fetched again.)
    shard = served["root"] / "shards" / "train-001.tar"
    original = shard.read_bytes()
    try:
        reading = feedline.ImageLoader(url, **dict(kw, shuffle=False))
        shard.write_bytes(original[512:] + original[:512])  # same size, other bytes
        _touch_later(shard)  # another ETag for nginx
        with pytest.raises(feedline.DataError, match=r"train-001\.tar: HTTP 412: the object "
                                                     r"changed since it was catalogued"):
            _epoch(reading)
        with pytest.raises(feedline.DataError, match=r"train-001\.tar: malformed tar"):
            feedline.ImageLoader(url, **kw)  # opened now: fetched again (and it is no tar)
    finally:
        shard.write_bytes(original)
    # Fixed on the server: the bad copy was not kept, the next open fetches and reads it.
    for a, b in zip(local, _epoch(feedline.ImageLoader(url, **kw))):
        assert torch.equal(a, b)
    # A budget for one shard keeps one (the least recently used ones go).
    one = os.path.getsize(served["root"] / "shards" / "train-000.tar")
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", str(int(one * 1.5)))
    shutil.rmtree(tmp_path / "cache")
    for a, b in zip(local, _epoch(feedline.ImageLoader(url, **kw))):
        assert torch.equal(a, b)
    assert len(_cache_files(tmp_path)[0]) == 1
    # Room in the budget again: the shards read by range meanwhile are downloaded at the next
    # open (the whole data set is then read from disk: no range request).
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", str(one * 10))
    roomy = feedline.ImageLoader(url, **kw)
    assert len(_cache_files(tmp_path)[0]) == 3
    for a, b in zip(local, _epoch(roomy)):
        assert torch.equal(a, b)
    assert roomy.stats().get("remote", {}).get("requests", 0) == 0
    monkeypatch.setenv("FEEDLINE_SHARD_CACHE_BYTES", "lots")
    with pytest.raises(ValueError, match="FEEDLINE_SHARD_CACHE_BYTES"):
        feedline.ImageLoader(url, **kw)


_OPEN_SCRIPT = r"""
import json, os, sys, time
import feedline
go = sys.argv[2]
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.005)
ld = feedline.ImageLoader(sys.argv[1], batch_size=5, transform="eval", size=64, resize_size=72,
                          shuffle=False)
print(json.dumps([s[0] for s in ld.samples]), flush=True)
"""


def _open_in_process(tmp_path, url, rank, go):
    script = tmp_path / "open.py"
    script.write_text(_OPEN_SCRIPT)
    env = dict(os.environ, FEEDLINE_CACHE_DIR=str(tmp_path / "cache"), RANK=str(rank),
               LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    env.pop("FEEDLINE_SHARD_CACHE_BYTES", None)
    p = subprocess.Popen([sys.executable, str(script), url, str(go)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert p.stdout.readline().strip() == "ready"
    return p


def test_ranks_of_a_node_download_each_shard_once(served, proxy, tmp_path):
    """Two processes as two ranks of one node, the same cache folder, opened at the same
    instant: each shard is downloaded once (GETs counted at the server), both get it whole."""
    p, base = proxy(trickle=0.05)  # ~1 s a shard: the two opens overlap
    url = base + "/shards/train-{000..002}.tar"
    go = tmp_path / "go"
    procs = [_open_in_process(tmp_path, url, r, go) for r in range(2)]
    go.write_text("")
    outs = []
    for q in procs:
        out, _ = q.communicate(timeout=120)
        assert q.returncode == 0, out
        outs.append(out.strip().splitlines()[-1])
    assert outs[0] == outs[1] and len(json.loads(outs[0])) == len(served["entries"])
    assert p.gets == 3  # not 6: one download per shard for the node
    tars, catalogs, parts = _cache_files(tmp_path)
    assert len(tars) == 3 and len(catalogs) == 3 and not parts


def test_a_rank_killed_mid_download_leaves_the_cache_usable(served, proxy, tmp_path,
                                                           monkeypatch):
    """A process killed while it downloads a shard (holding its lock): the lock dies with it,
    its part file is never read as data, and the next open fetches and reads every shard."""
    monkeypatch.setenv("FEEDLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("FEEDLINE_SHARD_CACHE_BYTES", raising=False)
    kw = dict(KW, shuffle=True, seed=3)
    local = _epoch(feedline.ImageLoader(served["shards"], **kw))
    p, base = proxy(trickle=0.2)
    url = base + "/shards/train-{000..002}.tar"
    go = tmp_path / "go"
    go.write_text("")
    victim = _open_in_process(tmp_path, url, 0, go)
    shards = tmp_path / "cache" / "shards"
    with util.deadline(60, "a part file"):
        while not (shards.exists() and any(n.endswith(".part") for n in os.listdir(shards))):
            time.sleep(0.01)
    victim.kill()
    victim.communicate()
    assert _cache_files(tmp_path)[2]  # what it left: part files, no shard
    p.trickle = 0.0
    with util.deadline(60, "the open after the kill"):
        survivor = feedline.ImageLoader(url, **kw)
    for a, b in zip(local, _epoch(survivor)):
        assert torch.equal(a, b)
    tars, catalogs, parts = _cache_files(tmp_path)
    assert len(tars) == 3 and len(catalogs) == 3
    assert not parts  # the dead process's part file: its lock was free, so it was removed


def test_credentials_never_reach_text_messages_stats_or_repr(served, tmp_path):
    """A text file read over HTTP with user information (a password with '/', '?' and '#' in
    it) and a presigned query: its DataErrors, stats()["errors"] and repr() name the file
    without either."""
    if shutil.which("spm_train") is None:
        pytest.skip("spm_train missing")
    corpus = served["root"] / "docs.txt"
    corpus.write_text("good words here\n\u00a0\nmore good words\n", encoding="utf-8")
    train = tmp_path / "train.txt"
    train.write_text("good words here more words\n" * 50)
    subprocess.run(["spm_train", f"--input={train}", f"--model_prefix={tmp_path}/m",
                    "--vocab_size=30", "--hard_vocab_limit=false", "--minloglevel=2"],
                   check=True, capture_output=True)
    query = "?X-Amz-Signature=SIGSECRET&X-Amz-Security-Token=TOKSECRET"
    base = f"127.0.0.1:{served['port']}/docs.txt"
    url = f"http://alice:hunter2pw@{base}{query}"
    ld = feedline.TextLoader(url, tokenizer=f"{tmp_path}/m.model", batch_size=1, shuffle=False)
    shown = [repr(ld)]
    with pytest.raises(feedline.DataError) as e:
        list(ld)
    shown.append(str(e.value))
    assert "docs.txt:2" in shown[-1], shown
    skip = feedline.TextLoader(url, tokenizer=f"{tmp_path}/m.model", batch_size=1,
                               shuffle=False, on_error="skip")
    list(skip)
    shown.append(repr(skip.stats()))
    # A password with an unencoded '/', '?' and '#': libcurl refuses the URL; the message too
    # names it without the password.
    with pytest.raises(Exception) as e:
        list(feedline.TextLoader(f"http://alice:hunter/2?pw#x@{base}{query}",
                                 tokenizer=f"{tmp_path}/m.model", batch_size=1))
    shown.append(str(e.value))
    for text in shown:
        for leak in ("alice", "hunter", "2pw", "2?pw", "SIGSECRET", "TOKSECRET"):
            assert leak not in text, (leak, text)
