"""`pip install .`: feedline's Python package, built by CMake with the machine's toolchain.

    python3 -m venv --system-site-packages .venv && .venv/bin/pip install .

Offline: there is no pyproject.toml, so pip builds with the setuptools it finds (Debian's,
through --system-site-packages) instead of fetching build requirements. The extension is built
in build/pip (FEEDLINE_BUILD_DIR overrides it) with only the Python module's targets; torch and
numpy come from the system (Debian's python3-torch, python3-numpy).
"""

import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.egg_info import egg_info

HERE = os.path.dirname(os.path.abspath(__file__))


def version():
    with open(os.path.join(HERE, "CMakeLists.txt")) as f:
        return re.search(r"project\(feedline VERSION ([0-9.]+)", f.read()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = os.environ.get("FEEDLINE_BUILD_DIR", os.path.join(HERE, "build", "pip"))
        configure = ["cmake", "-S", HERE, "-B", build, "-DCMAKE_BUILD_TYPE=Release",
                     f"-DPython_EXECUTABLE={sys.executable}", "-DFEEDLINE_BUILD_TESTS=OFF",
                     "-DFEEDLINE_BUILD_BENCHMARKS=OFF", "-DFEEDLINE_BUILD_PYTHON=ON"]
        if shutil.which("ninja"):
            configure += ["-G", "Ninja"]
        subprocess.check_call(configure)
        subprocess.check_call(["cmake", "--build", build, "--target", "feedline_python",
                               "--parallel", str(os.cpu_count() or 1)])
        built = glob.glob(os.path.join(build, "python", "feedline", "_feedline*.so"))
        if not built:
            raise RuntimeError(f"feedline: the CMake build left no _feedline module in {build}")
        dest = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        shutil.copyfile(built[0], dest)
        # The SentencePiece plugin goes beside the extension (src/text/sentencepiece_model.cc).
        plugin = os.path.join(build, "python", "feedline", "libfeedline_sentencepiece.so")
        shutil.copyfile(plugin, os.path.join(os.path.dirname(dest), os.path.basename(plugin)))


class EggInfoInBuild(egg_info):
    """The package metadata under build/pip, not feedline.egg-info beside the sources: pip
    builds in the source tree, which stays as it was (an explicit --egg-base still wins)."""

    def initialize_options(self):
        super().initialize_options()
        base = os.environ.get("FEEDLINE_BUILD_DIR", os.path.join(HERE, "build", "pip"))
        os.makedirs(base, exist_ok=True)
        self.egg_base = os.path.relpath(base, os.getcwd())


setup(
    name="feedline",
    version=version(),
    description="A high-throughput data loader for deep-learning training (C++ core)",
    license="Apache-2.0",
    packages=["feedline", "feedline.dataloader"],
    package_dir={"feedline": "python/feedline"},
    ext_modules=[Extension("feedline._feedline", sources=[])],
    cmdclass={"build_ext": CMakeBuild, "egg_info": EggInfoInBuild},
    python_requires=">=3.9",
    zip_safe=False,
)
