"""Builds vaiq's wheel (pyproject.toml) with the project's own CMake build.

The product (the command, the libraries, the built-in plugins, the Python
module) is built and installed into a staging prefix, whose tree the package
then carries inside itself:

    vaiq/__init__.py, __main__.py, distributed.py, _vaiq.*.so
    vaiq/bin/vaiq                      the command (the `vaiq` entry point runs it)
    vaiq/lib/libvaiq*.so               found by the module through its RPATH ($ORIGIN/lib)
    vaiq/lib/vaiq/plugins/*.so         found by the host beside itself
    vaiq/share/vaiq/recipes/*.yaml     the shipped recipes, found the same way
    vaiq/include, vaiq/lib/cmake       the plugin SDK (vaiq.cmake_dir())

Every path inside is relative, so the installed wheel works wherever pip puts
it. The libraries vaiq links (oneDNN, ONNX, protobuf, yaml-cpp, ...) come from
the system's packages (scripts/install-deps.sh), as for a CMake install.

Environment:
  VAIQ_BUILD_DIR   an already configured build tree to build and install from
                   (the tests use their own); by default build/wheel, configured
                   here in Release without the tests.
  VAIQ_WHEEL_WORK  setuptools' scratch folder (default build/wheel-setuptools).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

ROOT = Path(__file__).resolve().parent
# setuptools' own scratch (build/lib, build/bdist.*, the egg-info and the
# staging prefix) under build/, not beside the sources.
WORK = Path(os.environ.get("VAIQ_WHEEL_WORK") or ROOT / "build" / "wheel-setuptools").resolve()


def project_version():
    text = (ROOT / "CMakeLists.txt").read_text()
    return re.search(r"project\(vaiq VERSION ([0-9.]+)", text).group(1)


def run(*command):
    print("+", " ".join(str(c) for c in command), flush=True)
    subprocess.run([str(c) for c in command], check=True)


def cache_value(build_dir, name):
    for line in (build_dir / "CMakeCache.txt").read_text().splitlines():
        if line.startswith(name + ":"):
            return line.split("=", 1)[1]
    raise RuntimeError(f"{build_dir}: {name} is not in CMakeCache.txt")


class PlatformDistribution(Distribution):
    """The wheel holds compiled code: tag it for this Python and platform."""

    def has_ext_modules(self):
        return True


class BuildWithCMake(build_py):
    """build_py, then the CMake product installed into the package."""

    def run(self):
        super().run()
        build_dir = Path(os.environ.get("VAIQ_BUILD_DIR") or ROOT / "build" / "wheel").resolve()
        if not (build_dir / "CMakeCache.txt").exists():
            generator = ["-G", "Ninja"] if shutil.which("ninja") else []
            run("cmake", "-S", ROOT, "-B", build_dir, *generator, "-DCMAKE_BUILD_TYPE=Release",
                "-DVAIQ_BUILD_TESTS=OFF", f"-DPython_EXECUTABLE={sys.executable}")
        run("cmake", "--build", build_dir, "--target", "vaiq_product", "--parallel", str(os.cpu_count() or 2))
        staging = WORK / "staging"
        shutil.rmtree(staging, ignore_errors=True)
        run("cmake", "--install", build_dir, "--prefix", staging)

        package = Path(self.build_lib) / "vaiq"
        site = staging / cache_value(build_dir, "VAIQ_PYTHON_INSTALL_DIR")
        for built in (site / "vaiq").glob("*.so"):  # the compiled module beside the Python sources
            shutil.copy2(built, package / built.name)
        shutil.rmtree(site)  # the rest of the installed package is build_py's
        flatten_library_links(staging / "lib")
        for part in ("bin", "lib", "share", "include"):
            if (staging / part).exists():
                shutil.copytree(staging / part, package / part, dirs_exist_ok=True)


def flatten_library_links(lib):
    """A wheel cannot hold symbolic links: each library is kept under its
    SONAME (the link the loader follows), the development links are dropped,
    and the fully versioned file stays only where the SDK's CMake files name it."""
    cmake_text = "".join(p.read_text() for p in (lib / "cmake").rglob("*.cmake")) if (lib / "cmake").exists() else ""
    links = [p for p in lib.iterdir() if p.is_symlink()]
    real = {p.resolve() for p in links}
    for link in links:
        target = link.parent / os.readlink(link)
        if target.is_symlink():
            link.unlink()  # libx.so -> libx.so.1: only the linker reads it
    for link in [p for p in lib.iterdir() if p.is_symlink()]:
        target = link.resolve()
        link.unlink()
        shutil.copy2(target, link)
    for path in real:
        if path.name not in cmake_text:
            path.unlink()


WORK.mkdir(parents=True, exist_ok=True)
setup(
    version=project_version(),
    packages=["vaiq"],
    package_dir={"vaiq": "python/vaiq"},
    distclass=PlatformDistribution,
    cmdclass={"build_py": BuildWithCMake},
    zip_safe=False,
    options={"build": {"build_base": str(WORK)}, "egg_info": {"egg_base": str(WORK)}},
)
