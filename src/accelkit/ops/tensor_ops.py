"""``TensorOps``: the operations every backend runs.

Every method is a *submission*: it validates its arguments (here, once for every backend),
allocates the output, enqueues the work on the current stream and returns the output tensor at
once, as a CUDA launch does. Nothing is computed yet when it returns; results are observed by
awaiting a transfer, an event or ``synchronize``. A call that raises has changed nothing.

Backends implement :class:`accelkit.sdk.TensorKernels`, whose methods receive validated inputs
and allocated outputs and must enqueue (not run to completion on the caller's thread, unless the
work is small and the stream idle) work that writes the outputs. The parts live in
``accelkit.ops._mixins``:
elementwise, linalg, reduction, shape, arrange (pad, flip, tile, ...), scan (cumulative sums,
sorting), nn and image (arrange, scan and image ops are compositions a backend may replace with
optional kernels).
"""

from __future__ import annotations

from accelkit._core.op_names import BINARY_OPS, REDUCE_OPS, TENSOR_OPS, UNARY_OPS
from accelkit.ops._mixins.arrange import ArrangeOps
from accelkit.ops._mixins.attention_options import AttentionOptionsOps
from accelkit.ops._mixins.elementwise import ElementwiseOps, Operand
from accelkit.ops._mixins.image import ImageOps
from accelkit.ops._mixins.indexing import IndexingOps
from accelkit.ops._mixins.linalg import LinalgOps
from accelkit.ops._mixins.nn import NNOps
from accelkit.ops._mixins.norms import NormOps
from accelkit.ops._mixins.pooling import PoolingOps
from accelkit.ops._mixins.reduction import ReductionOps
from accelkit.ops._mixins.scan import ScanOps
from accelkit.ops._mixins.shape import ShapeOps

__all__ = ["BINARY_OPS", "REDUCE_OPS", "TENSOR_OPS", "UNARY_OPS", "Operand", "TensorOps"]


class TensorOps(
    ElementwiseOps,
    LinalgOps,
    ReductionOps,
    ShapeOps,
    ArrangeOps,
    IndexingOps,
    ScanOps,
    NNOps,
    AttentionOptionsOps,
    NormOps,
    PoolingOps,
    ImageOps,
):
    """All tensor operations of one backend (see the module docstring), over the backend's
    TensorKernels (``StreamBackend`` builds it from the ``Opened`` record)."""

    __slots__ = ()
