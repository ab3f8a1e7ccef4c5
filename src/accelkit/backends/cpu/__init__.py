"""The embedded CPU backend on NumPy: always available, and the numerical reference."""

from accelkit.backends.cpu.backend import CPUBackend

__all__ = ["CPUBackend"]
