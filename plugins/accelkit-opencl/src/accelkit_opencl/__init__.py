"""accelkit-opencl: the OpenCL backend plugin (imports nothing: listing backends stays cheap)."""

__version__ = "0.2.0"
