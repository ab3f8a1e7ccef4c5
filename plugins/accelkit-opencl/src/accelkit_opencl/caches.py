"""Where the OpenCL plugin caches what it builds (this module imports no PyOpenCL).

Everything is accelkit's, per plugin version: ``$ACCELKIT_OPENCL_CACHE``, else
``opencl/<plugin version>/`` under :func:`accelkit.calibration.cache_dir`. The folder holds
program binaries (``<key>.bin``, :mod:`accelkit_opencl.programs`), the verdicts of kernel-variant
verification (``variants.json``, :mod:`accelkit_opencl.variants`), the GEMM tuning
(``gemm-tuning.json``) and PoCL's own kernel cache (``pocl/``). PoCL's default folder
(``~/.cache/pocl``) is shared with every other OpenCL program on the machine, and an entry that a
crashed compiler left there makes later builds "succeed" with no kernels in them
(``INVALID_KERNEL_NAME``); a new plugin version starts with fresh caches.
"""

from __future__ import annotations

import os
from pathlib import Path

from accelkit.sdk import env_str

__all__ = ["cache_folder", "plugin_version", "use_private_pocl_cache"]


def plugin_version() -> str:
    from accelkit_opencl.descriptor import DESCRIPTOR

    return DESCRIPTOR.version


def cache_folder() -> Path:
    """The plugin's cache folder (see the module docstring)."""
    override = env_str("ACCELKIT_OPENCL_CACHE")
    if override:
        return Path(override)
    from accelkit.calibration import cache_dir

    return cache_dir() / "opencl" / plugin_version()


def use_private_pocl_cache() -> None:
    """Point PoCL's kernel cache into :func:`cache_folder` (``pocl/``), unless
    ``POCL_CACHE_DIR`` is set already. Must run before the OpenCL platform is first loaded: PoCL
    reads the variable once."""
    if not os.environ.get("POCL_CACHE_DIR"):
        os.environ["POCL_CACHE_DIR"] = str(cache_folder() / "pocl")
