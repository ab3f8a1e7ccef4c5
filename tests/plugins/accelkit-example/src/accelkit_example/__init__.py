"""accelkit-example: an example accelkit backend plugin, written only against ``accelkit.sdk``.

Its device, ``example:0``, keeps tensors in untyped host memory and runs every kernel on a stream
worker thread. It imports nothing here: Python imports this package before the descriptor
module, so whatever this file imports is paid by every listing of plugins.
"""

__version__ = "0.1.0"
