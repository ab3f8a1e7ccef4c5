"""The embedded CPU backend on NumPy: always available, and the numerical reference.

Importing this package imports nothing heavy (its descriptor and probe are read by the registry);
the backend itself is ``accelkit.backends.cpu.backend.CPUBackend``.
"""
