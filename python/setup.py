"""Builds and installs plexus_torch, the torch.distributed backend "plexus".

    python3 -m venv --system-site-packages venv    # Debian's torch stays visible
    venv/bin/pip install --no-build-isolation ./python   # from the root of a Plexus checkout

The extension (plexus_torch._C) is built with CMake from this checkout, against the torch that
the installing Python imports; nothing is downloaded. PLEXUS_BUILD_DIR=<dir> reuses an existing
CMake build directory of the checkout (configured with the torch backend) instead of a new one;
PLEXUS_CMAKE_ARGS adds configure arguments; PLEXUS_BUILD_JOBS sets the build's parallelism.
"""

import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent  # the checkout: pip builds in place, so python/ still sits inside it


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    found = re.search(r"project\(plexus VERSION ([0-9.]+)", text)
    if not found:
        raise RuntimeError(f"no 'project(plexus VERSION ...)' in {ROOT / 'CMakeLists.txt'}")
    return found.group(1)


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def run(self):
        if not (ROOT / "CMakeLists.txt").exists() or not (ROOT / "libs" / "torch").is_dir():
            raise RuntimeError(
                f"plexus_torch must be built from inside a Plexus checkout ({ROOT} is not one): "
                "run 'pip install --no-build-isolation ./python' from the checkout's root"
            )
        if shutil.which("cmake") is None:
            raise RuntimeError("cmake is not on PATH (Debian: apt-get install cmake ninja-build)")
        try:
            import torch  # noqa: F401
        except ImportError as e:
            raise RuntimeError(
                f"{sys.executable} cannot import torch ({e}): create the venv with "
                "--system-site-packages so that Debian's python3-torch is visible, and build "
                "without isolation if your pip isolates builds (pip install --no-build-isolation)"
            ) from e
        super().run()

    def build_extension(self, ext):
        reuse = os.environ.get("PLEXUS_BUILD_DIR")
        build_dir = pathlib.Path(reuse or pathlib.Path(self.build_temp).resolve() / "cmake")
        jobs = os.environ.get("PLEXUS_BUILD_JOBS", str(os.cpu_count() or 2))
        if not reuse:
            configure = [
                "cmake", "-S", str(ROOT), "-B", str(build_dir),
                "-DCMAKE_BUILD_TYPE=Release",
                "-DPLEXUS_WITH_TORCH=ON",
                f"-DPLEXUS_TORCH_PYTHON={sys.executable}",
                "-DPLEXUS_BUILD_TESTS=OFF", "-DPLEXUS_BUILD_EXAMPLES=OFF",
                "-DPLEXUS_BUILD_BENCH=OFF", "-DPLEXUS_BUILD_TOOLS=OFF",
                "-DPLEXUS_INSTALL=OFF",
            ]
            if shutil.which("ninja"):
                configure += ["-G", "Ninja"]
            configure += shlex.split(os.environ.get("PLEXUS_CMAKE_ARGS", ""))
            subprocess.check_call(configure)
        elif not (build_dir / "CMakeCache.txt").exists():
            raise RuntimeError(f"PLEXUS_BUILD_DIR={build_dir} is not a configured CMake build")
        subprocess.check_call(
            ["cmake", "--build", str(build_dir), "--target", "plexus_torch_python", "-j", jobs]
        )
        built = sorted((build_dir / "python" / "plexus_torch").glob("_C*.so"))
        if not built:
            raise RuntimeError(
                f"the build left no plexus_torch/_C*.so in {build_dir / 'python'}: was the torch "
                "backend enabled (PLEXUS_WITH_TORCH)?"
            )
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built[-1], target)


setup(
    name="plexus-torch",
    version=project_version(),
    description="Plexus collectives as a torch.distributed backend ('plexus')",
    license="Apache-2.0",
    python_requires=">=3.9",
    packages=["plexus_torch"],
    package_dir={"plexus_torch": str(HERE / "plexus_torch")},
    ext_modules=[CMakeExtension("plexus_torch._C")],
    cmdclass={"build_ext": CMakeBuild},
    zip_safe=False,
)
