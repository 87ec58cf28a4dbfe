"""`pip install .` builds in the source tree: its metadata step must leave the tree clean."""

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_package_metadata_goes_to_the_build_dir_not_the_source_tree(tmp_path):
    before = set(os.listdir(ROOT))
    env = dict(os.environ, FEEDLINE_BUILD_DIR=str(tmp_path / "pip"))
    r = subprocess.run([sys.executable, "setup.py", "-q", "egg_info"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert set(os.listdir(ROOT)) == before, "setup.py egg_info wrote into the source tree"
    assert (tmp_path / "pip" / "feedline.egg-info" / "PKG-INFO").exists()
    # Every module of the package is in it, sub-packages included.
    sources = (tmp_path / "pip" / "feedline.egg-info" / "SOURCES.txt").read_text().split()
    package = os.path.join(ROOT, "python", "feedline")
    for folder, _, files in os.walk(package):
        for name in files:
            if name.endswith(".py"):
                rel = os.path.relpath(os.path.join(folder, name), ROOT)
                assert rel in sources, f"{rel} is not in the pip package"
