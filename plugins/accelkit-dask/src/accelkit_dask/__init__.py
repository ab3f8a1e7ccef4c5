"""accelkit-dask: an accelkit backend whose device is a Dask distributed cluster.

Tensors are dask arrays chunked across the cluster's workers; every operation is a blockwise task
graph whose blocks run accelkit's CPU kernels on the workers. This file imports nothing: Python
imports the package before the descriptor module, and listing plugins must stay cheap.
"""

__version__ = "0.1.0"
