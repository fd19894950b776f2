"""pycni's build backend: setuptools', leaving no ``build/`` directory in the clone.

setuptools builds a wheel through ``build/lib`` in the source tree and keeps it: the clone is
left with a build/ after ``pip install .``, and a later build ships every module that was ever
in it, deleted ones too. Each build here starts from no build/ and removes it afterwards.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403 - every other hook as setuptools has it

_BUILD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build")


def _clean() -> None:
    shutil.rmtree(_BUILD, ignore_errors=True)


def build_wheel(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                metadata_directory: str | None = None) -> str:
    _clean()
    try:
        return _setuptools.build_wheel(wheel_directory, config_settings, metadata_directory)
    finally:
        _clean()


def build_editable(wheel_directory: str, config_settings: dict[str, Any] | None = None,
                   metadata_directory: str | None = None) -> str:
    _clean()
    try:
        return _setuptools.build_editable(wheel_directory, config_settings, metadata_directory)
    finally:
        _clean()
