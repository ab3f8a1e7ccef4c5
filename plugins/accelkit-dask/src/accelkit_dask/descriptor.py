"""The Dask backend's plugin descriptor. Imports no dask: listing backends stays cheap."""

from __future__ import annotations

from accelkit.plugins import PluginDescriptor
from accelkit_dask import __version__

DESCRIPTOR = PluginDescriptor(
    name="dask",
    distribution="accelkit-dask",
    version=__version__,
    api_version="3.0",
    device_kinds=frozenset({"dask"}),
    priority=-10,  # on one machine the CPU backend is the better choice: never win a tie
    backend_class="accelkit_dask.backend:DaskBackend",
    probe="accelkit_dask.probe:probe",
    summary="tensors chunked over a Dask cluster's workers (a local one, or dask://host:port)",
    hardware_hint="dask.distributed is installed (a scheduler address in ACCELKIT_DASK_SCHEDULER"
    " adds that cluster)",
)
