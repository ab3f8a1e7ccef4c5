"""accelkit-webgpu: an accelkit backend on WebGPU adapters through wgpu-py.

Every operation runs as a WGSL compute shader on the adapter. This file imports nothing: Python
imports the package before the descriptor module, and listing plugins must stay cheap.
"""

__version__ = "0.1.0"
