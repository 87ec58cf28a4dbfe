"""nginx (Debian's nginx-light, installed by cmake/install-deps.sh) on a free loopback port, for
the remote-storage tests and bench/remote_compare.py: serves a folder, optionally after a fixed
delay per request (the echo module's non-blocking echo_sleep, which nginx-light ships: the
latency of a remote object store, added on the server side as a real one would have it), with
extra `location` blocks.

    with serve(root, work, latency_ms=20) as (base_url, pid):
        ...
"""

import contextlib
import os
import shutil
import socket
import subprocess
import time

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx") else None)
ECHO_MODULE = "/usr/lib/nginx/modules/ngx_http_echo_module.so"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(port, timeout=10.0):
    end = time.time() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            if time.time() > end:
                raise RuntimeError(f"nothing listens on port {port}")
            time.sleep(0.05)


def self_signed_cert(work):
    """A certificate for 127.0.0.1 and its key (openssl, made in `work`): (cert, key) paths. The
    certificate is its own CA: trust it with CURL_CA_BUNDLE / SSL_CERT_FILE."""
    work = str(work)
    os.makedirs(work, exist_ok=True)
    cert, key = os.path.join(work, "cert.pem"), os.path.join(work, "key.pem")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", key,
                    "-out", cert, "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


@contextlib.contextmanager
def serve(root, work, latency_ms=0.0, locations="", worker_processes=1, tls=None,
          file_cache=False):
    """Starts nginx serving `root`; yields (base URL, master pid); stops it on exit. `work` is a
    folder for its configuration, pid file, log and temporary files. `tls`: (cert, key) paths
    to serve HTTPS instead. `file_cache`: nginx keeps files open and their metadata for a
    minute (open_file_cache, as a static server is configured for speed; tests that change
    files under it leave it off)."""
    if NGINX is None:
        raise RuntimeError("nginx missing (cmake/install-deps.sh installs nginx-light)")
    work = str(work)
    port = free_port()
    os.makedirs(os.path.join(work, "tmp"), exist_ok=True)
    module = ""
    root_location = ""
    if latency_ms > 0:
        if not os.path.exists(ECHO_MODULE):
            raise RuntimeError(f"{ECHO_MODULE} missing (Debian's libnginx-mod-http-echo)")
        module = f"load_module {ECHO_MODULE};\n"
        root_location = (f"location / {{ echo_sleep {latency_ms / 1000:.3f}; echo_exec @file; }}\n"
                         "    location @file { }\n")
    user = "user root;\n" if os.geteuid() == 0 else ""
    listen_tls = f" ssl;\n    ssl_certificate {tls[0]};\n    ssl_certificate_key {tls[1]}" \
        if tls else ""
    conf = os.path.join(work, "nginx.conf")
    with open(conf, "w") as f:
        f.write(f"""{module}{user}daemon off;
worker_processes {worker_processes};
pid {work}/nginx.pid;
error_log {work}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  sendfile on;
  keepalive_requests 100000;
  {"open_file_cache max=10000 inactive=60s;" if file_cache else ""}
  client_body_temp_path {work}/tmp;
  proxy_temp_path {work}/tmp;
  fastcgi_temp_path {work}/tmp;
  uwsgi_temp_path {work}/tmp;
  scgi_temp_path {work}/tmp;
  server {{
    listen 127.0.0.1:{port}{listen_tls};
    root {root};
    {locations}
    {root_location}
  }}
}}
""")
    proc = subprocess.Popen([NGINX, "-c", conf, "-p", work], stderr=subprocess.PIPE)
    try:
        wait_for(port)
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}", proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)
