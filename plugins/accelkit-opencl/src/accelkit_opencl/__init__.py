"""accelkit-opencl: the OpenCL backend plugin (imports nothing: listing backends stays cheap)."""
