"""`make install` is quiet, and the package carries what `--local` builds from.

The install test runs the Makefile's own pip command (the .venv's pip, which
shows the build backend's warnings even with --quiet) on a copy of the
project into a throwaway environment; pip fetches setuptools from PyPI for
the isolated build, as `make install` does.
"""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
from pathlib import Path

from gpuclaimctl.controlplane import build

REPO = Path(__file__).resolve().parent.parent
PROJECT_FILES = ("setup.cfg", "pyproject.toml", "README.md")


def configured_packages() -> tuple[list[str], dict[str, list[str]]]:
    from setuptools.config.setupcfg import read_configuration

    options = read_configuration(str(REPO / "setup.cfg"))["options"]
    return list(options["packages"]), dict(options.get("package_data") or {})


def copy_project(dest: Path) -> Path:
    packages, _ = configured_packages()
    for name in PROJECT_FILES:
        shutil.copy(REPO / name, dest / name)
    for top in {p.split(".")[0] for p in packages}:
        shutil.copytree(REPO / top, dest / top, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_editable_install_prints_nothing(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    source = copy_project(tmp_path / "src")
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"), "install",
         "--quiet", "--disable-pip-version-check", "--no-deps", "-e", str(source)],
        capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert (done.stdout + done.stderr).strip() == ""


def test_every_folder_in_the_packages_is_a_package() -> None:
    """setuptools warns at length about a folder Python can import (any
    folder, since namespace packages) that the configuration leaves out."""
    packages, _ = configured_packages()
    for top in {p.split(".")[0] for p in packages}:
        for folder in [REPO / top, *(REPO / top).rglob("*")]:
            if folder.is_dir() and folder.name != "__pycache__" \
                    and any(f.is_file() for f in folder.iterdir()):
                name = ".".join(folder.relative_to(REPO).parts)
                assert name in packages, f"{name} is not in setup.cfg's packages"


def test_go_modules_of_the_local_plane_are_package_data() -> None:
    """`gpuclaimctl run --local` from an installed (not editable) package
    builds the plane from these files."""
    _, package_data = configured_packages()
    files = [f for f in build.GOMOD_DIR.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    assert files
    for f in files:
        package = ".".join(f.parent.relative_to(REPO).parts)
        assert any(fnmatch.fnmatch(f.name, pattern) for pattern in package_data.get(package, ())), \
            f"{f.relative_to(REPO)} is not in setup.cfg's package_data"
