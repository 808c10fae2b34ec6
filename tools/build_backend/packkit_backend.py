"""packkit's build backend: scikit-build-core, after one check that torch is importable.

The compiled ops build against the installed torch's headers and libraries, so torch cannot be a build
requirement (pip would put a fresh, multi-GB CUDA torch into an isolated build environment, and the ops
would be built against a torch other than the one they run with). Without this check, a plain
``pip install packkit-X.tar.gz`` on a machine without torch would first resolve ``torch>=2.10`` from the
metadata and download a CUDA torch before failing in CMake; with it, pip stops at once with what to do.
Building the sdist itself needs no torch.
"""
from __future__ import annotations

import importlib.util
import sys

from scikit_build_core import build as _backend
from scikit_build_core.build import build_sdist, get_requires_for_build_sdist  # noqa: F401  (no torch needed)

MESSAGE = (
    "packkit builds its ops against the torch that is installed (torch >= 2.10), and none is importable by {python}. "
    "Install torch first (the build you will train with: CPU or CUDA), then build without isolation so the build "
    "sees it:\n    pip install torch\n    pip install --no-build-isolation packkit  (or: .  /  packkit-X.tar.gz)\n"
    "A prebuilt wheel (docs/install.md) needs no build at all.")


def _need_torch() -> None:
    if importlib.util.find_spec("torch") is None:
        raise RuntimeError(MESSAGE.format(python=sys.executable))


def get_requires_for_build_wheel(config_settings=None):
    _need_torch()
    return _backend.get_requires_for_build_wheel(config_settings)


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    _need_torch()
    return _backend.prepare_metadata_for_build_wheel(metadata_directory, config_settings)


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _need_torch()
    return _backend.build_wheel(wheel_directory, config_settings, metadata_directory)


def get_requires_for_build_editable(config_settings=None):
    _need_torch()
    return _backend.get_requires_for_build_editable(config_settings)


def prepare_metadata_for_build_editable(metadata_directory, config_settings=None):
    _need_torch()
    return _backend.prepare_metadata_for_build_editable(metadata_directory, config_settings)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _need_torch()
    return _backend.build_editable(wheel_directory, config_settings, metadata_directory)
