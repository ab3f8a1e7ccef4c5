"""accelkit-testplug-good: a fake GPU backend, ``fakegpu``, made for accelkit's tests.

It drives two devices of kind ``fakegpu`` (a slow ``fakegpu:0`` and a fast ``fakegpu:1``, by
their declared GFLOP/s) and computes on the host with the CPU backend's kernels. This package's
``__init__`` imports nothing, so that reading the descriptor stays as cheap as accelkit promises.
"""
