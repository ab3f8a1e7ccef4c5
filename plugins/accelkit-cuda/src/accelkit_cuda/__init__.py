"""accelkit-cuda: the CUDA backend plugin (imports nothing: listing backends stays cheap)."""
