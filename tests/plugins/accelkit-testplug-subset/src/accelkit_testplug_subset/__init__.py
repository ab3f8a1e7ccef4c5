"""accelkit-testplug-subset: a backend lacking ``attention``, made for accelkit's fallback tests.

It drives one device, ``subset:0``, and computes on the host with the CPU backend's kernels,
except ``attention``, which it refuses at submission with UnsupportedOperationError (and which
its capabilities omit; its KernelOps compose attention from TensorOps calls).
"""
