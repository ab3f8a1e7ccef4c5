"""Normalisation and losses beyond the kernels: batch_norm, group_norm, instance_norm, the
statistics of layer_norm and rms_norm, cross_entropy with class weights, ignore_index and label
smoothing, mse_loss and binary_cross_entropy_with_logits (PyTorch's semantics).

Compositions of other TensorOps, on the device. F16/BF16 inputs compute in F32 and round once;
statistics come back in the compute dtype (F32, or F64 for F64 input), as PyTorch's do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from accelkit._core.kernel_validation import check_norm
from accelkit._core.shapes import broadcast_shapes
from accelkit._core.validation import (
    check_float,
    check_float_param,
    check_int,
    check_same_dtype,
    check_tensor,
)
from accelkit.dtype import DType
from accelkit.errors import InvalidArgumentError
from accelkit.ops._mixins.base import OpsBase
from accelkit.sdk.kernels import TensorKernels
from accelkit.tensor import Tensor

if TYPE_CHECKING:
    from accelkit.ops.tensor_ops import TensorOps

__all__ = ["NormOps"]

_REDUCTIONS = ("mean", "sum", "none")


def _work(dtype: DType) -> DType:
    return DType.F64 if dtype is DType.F64 else DType.F32


class NormOps(OpsBase[TensorKernels]):
    """Normalisation statistics and losses (see the module docstring)."""

    def _ops(self) -> TensorOps:
        return self  # type: ignore[return-value]  # the final class is TensorOps

    def _up(self, x: Tensor) -> Tensor:
        w = _work(x._dtype)
        return x if x._dtype is w else self._ops().cast(x, w)

    # -- statistics of the row norms ----------------------------------------------------------------
    def layer_norm_with_stats(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``layer_norm`` that also returns the mean and the inverse standard deviation
        ``1/sqrt(var + eps)`` of each row (shape ``x.shape[:-1]``, in F32, or F64 for F64 x),
        which a backward pass needs."""
        eps_ = check_norm(self.backend, "layer_norm", x, eps, weight=weight, bias=bias)
        ops = self._ops()
        out = ops.layer_norm(x, weight, bias, eps_)
        xw = self._up(x)
        mean = ops.mean(xw, -1, keepdims=True)
        centered = ops.sub(xw, mean)
        var = ops.mean(ops.mul(centered, centered), -1)
        rstd = ops.rsqrt(ops.add(var, eps_))
        return out, ops.reshape(mean, x._shape[:-1]), rstd

    def rms_norm_with_stats(
        self, x: Tensor, weight: Tensor | None = None, eps: float = 1e-6
    ) -> tuple[Tensor, Tensor]:
        """``rms_norm`` that also returns each row's ``1/sqrt(mean(x^2) + eps)`` (shape
        ``x.shape[:-1]``, F32 or F64)."""
        eps_ = check_norm(self.backend, "rms_norm", x, eps, weight=weight)
        ops = self._ops()
        out = ops.rms_norm(x, weight, eps_)
        xw = self._up(x)
        return out, ops.rsqrt(ops.add(ops.mean(ops.mul(xw, xw), -1), eps_))

    # -- channel norms ----------------------------------------------------------------------------
    def batch_norm(
        self,
        x: Tensor,
        running_mean: Tensor | None = None,
        running_var: Tensor | None = None,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        *,
        training: bool = False,
        momentum: float = 0.1,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalise each channel of ``x`` [N, C, ...] (PyTorch's ``batch_norm``).

        Inference (``training=False``) uses ``running_mean``/``running_var`` [C] (required).
        Training uses the batch's mean and biased variance over every axis but 1, and, where
        running statistics are given, updates them in place (stream-ordered):
        ``running = (1 - momentum) * running + momentum * batch`` with the unbiased variance.
        ``weight``/``bias`` [C] scale and shift.
        """
        b = self.backend
        check_tensor(b, x)
        check_float(x, "batch_norm")
        if x.ndim < 2:
            raise InvalidArgumentError(f"batch_norm: x must be [N, C, ...]; got {x._shape}")
        if not isinstance(training, bool):
            raise InvalidArgumentError(f"batch_norm: training must be a bool; got {training!r}")
        c = x._shape[1]
        params = (("running_mean", running_mean), ("running_var", running_var),
                  ("weight", weight), ("bias", bias))  # fmt: skip
        for name, t in params:
            if t is not None:
                check_tensor(b, t, name)
                if t._shape != (c,):
                    raise InvalidArgumentError(f"batch_norm: {name} must be [{c}]; got {t._shape}")
                check_float(t, "batch_norm", name)
        if (running_mean is None) != (running_var is None):
            raise InvalidArgumentError("batch_norm: give running_mean and running_var together")
        if not training and running_mean is None:
            raise InvalidArgumentError(
                "batch_norm: inference (training=False) needs running_mean and running_var"
            )
        eps_ = check_float_param(eps, "eps", positive=True)
        momentum_ = check_float_param(momentum, "momentum")
        if not 0.0 <= momentum_ <= 1.0:
            raise InvalidArgumentError(f"batch_norm: momentum must be in [0, 1]; got {momentum}")
        count = x._size // c if c else 0
        if training and count <= 1 and running_mean is not None:
            raise InvalidArgumentError(
                f"batch_norm: training needs more than one value per channel; x is {x._shape}"
            )
        ops = self._ops()
        xw = self._up(x)
        line = (1, c) + (1,) * (x.ndim - 2)
        axes = (0, *range(2, x.ndim))
        if training:
            mean = ops.mean(xw, axes, keepdims=True)
            centered = ops.sub(xw, mean)
            var = ops.mean(ops.mul(centered, centered), axes, keepdims=True)
            if running_mean is not None and running_var is not None:
                self._update_running(running_mean, ops.reshape(mean, (c,)), momentum_)
                unbiased = ops.mul(ops.reshape(var, (c,)), count / (count - 1))
                self._update_running(running_var, unbiased, momentum_)
        else:
            assert running_mean is not None
            assert running_var is not None
            mean = ops.reshape(self._up(running_mean), line)
            var = ops.reshape(self._up(running_var), line)
            centered = ops.sub(xw, mean)
        y = ops.mul(centered, ops.rsqrt(ops.add(var, eps_)))
        return self._affine(y, weight, bias, line, x._dtype)

    def _update_running(self, running: Tensor, batch: Tensor, momentum: float) -> None:
        ops = self._ops()
        new = ops.add(ops.mul(self._up(running), 1.0 - momentum), ops.mul(batch, momentum))
        if new._dtype is not running._dtype:
            new = ops.cast(new, running._dtype)
        self.backend.memory_manager.copy_dtod(running, new)

    def _affine(
        self,
        y: Tensor,
        weight: Tensor | None,
        bias: Tensor | None,
        line: tuple[int, ...],
        dtype: DType,
    ) -> Tensor:
        ops = self._ops()
        if weight is not None:
            y = ops.mul(y, ops.reshape(self._up(weight), line))
        if bias is not None:
            y = ops.add(y, ops.reshape(self._up(bias), line))
        return y if y._dtype is dtype else ops.cast(y, dtype)

    def group_norm(
        self,
        x: Tensor,
        num_groups: int,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalise ``x`` [N, C, ...] over each group of ``C / num_groups`` channels and every
        other axis but the batch (biased variance), then scale and shift per channel with
        ``weight``/``bias`` [C] (PyTorch's ``group_norm``)."""
        return self._group_norm("group_norm", x, num_groups, weight, bias, eps)

    def instance_norm(
        self,
        x: Tensor,
        weight: Tensor | None = None,
        bias: Tensor | None = None,
        eps: float = 1e-5,
    ) -> Tensor:
        """Normalise each channel of each sample of ``x`` [N, C, ...] over its other axes
        (``group_norm`` with one channel a group; the batch's own statistics, as PyTorch's
        ``instance_norm`` uses by default)."""
        check_tensor(self.backend, x)
        if x.ndim < 2:
            raise InvalidArgumentError(f"instance_norm: x must be [N, C, ...]; got {x._shape}")
        return self._group_norm("instance_norm", x, x._shape[1], weight, bias, eps)

    def _group_norm(
        self,
        op: str,
        x: Tensor,
        num_groups: int,
        weight: Tensor | None,
        bias: Tensor | None,
        eps: float,
    ) -> Tensor:
        b = self.backend
        check_tensor(b, x)
        check_float(x, op)
        if x.ndim < 2:
            raise InvalidArgumentError(f"{op}: x must be [N, C, ...]; got {x._shape}")
        n, c = x._shape[:2]
        g = check_int(num_groups, "num_groups", minimum=1)
        if c % g:
            raise InvalidArgumentError(f"{op}: num_groups={g} must divide the {c} channels")
        for name, t in (("weight", weight), ("bias", bias)):
            if t is not None:
                check_tensor(b, t, name)
                check_same_dtype(op, x=x, **{name: t})
                if t._shape != (c,):
                    raise InvalidArgumentError(f"{op}: {name} must be [{c}]; got {t._shape}")
        eps_ = check_float_param(eps, "eps", positive=True)
        ops = self._ops()
        xw = self._up(x)
        per_group = x._size // (n * g) if n * g else 0
        if per_group == 0:
            y = xw
        else:
            y = ops.reshape(ops.layer_norm(ops.reshape(xw, (n, g, per_group)), eps=eps_), x._shape)
        return self._affine(y, weight, bias, (1, c) + (1,) * (x.ndim - 2), x._dtype)

    # -- losses -----------------------------------------------------------------------------------
    def _cross_entropy_composed(
        self,
        logits: Tensor,
        targets: Tensor,
        *,
        weight: Tensor | None = None,
        ignore_index: int | None = None,
        label_smoothing: float = 0.0,
        reduction: str = "mean",
    ) -> tuple[Tensor, Tensor]:
        """cross_entropy with PyTorch's options (see :meth:`NNOps.cross_entropy`, which has
        checked logits, targets and reduction)."""
        b = self.backend
        n, c = logits._shape
        if weight is not None:
            check_tensor(b, weight, "weight")
            check_float(weight, "cross_entropy", "weight")
            if weight._shape != (c,):
                raise InvalidArgumentError(
                    f"cross_entropy: weight must be [{c}]; got {weight._shape}"
                )
        ignore = None if ignore_index is None else check_int(ignore_index, "ignore_index")
        if ignore is not None and not -(2**63) <= ignore < 2**63:
            ignore = None  # no I64 target can equal it
        eps = check_float_param(label_smoothing, "label_smoothing")
        if not 0.0 <= eps <= 1.0:
            raise InvalidArgumentError(
                f"cross_entropy: label_smoothing must be in [0, 1]; got {label_smoothing}"
            )
        ops, f = self._ops(), b.tensor_factory
        work = _work(logits._dtype)
        x = self._up(logits)
        logp = ops.log_softmax(x, -1)
        probs = ops.softmax(logits, -1)
        t = ops.cast(targets, DType.I64) if targets._dtype is not DType.I64 else targets
        valid = None
        if ignore is not None:
            valid = ops.ne(t, ignore)
            t = ops.where(valid, t, 0)
        # embedding() of the class numbers checks each target's range (reported when awaited)
        # and gives it back as an [N, 1] index.
        checked = ops.embedding(t, ops.reshape(f.arange(c, dtype=DType.I64), (c, 1)))
        nll = ops.neg(ops.reshape(ops.gather(logp, 1, checked), (n,)))
        w_t: Tensor | None = None
        if weight is not None:
            w_t = ops.reshape(
                ops.embedding(ops.reshape(checked, (n,)), ops.reshape(self._up(weight), (c, 1))),
                (n,),
            )
            nll = ops.mul(nll, w_t)
        loss = nll
        if eps:
            logw = logp if weight is None else ops.mul(logp, ops.reshape(self._up(weight), (1, c)))
            smooth = ops.neg(ops.sum(logw, -1))
            loss = ops.add(ops.mul(nll, 1.0 - eps), ops.mul(smooth, eps / c))
        if valid is not None:
            loss = ops.where(valid, loss, 0.0)
        if reduction == "none":
            result = loss
        elif reduction == "sum":
            result = ops.sum(loss)
        else:
            if w_t is not None:
                counted = w_t if valid is None else ops.where(valid, w_t, 0.0)
                denominator = ops.sum(counted)
            elif valid is not None:
                denominator = ops.cast(ops.sum(valid), work)
            else:
                denominator = f.full((), float(n), work)
            result = ops.div(ops.sum(loss), denominator)
        if result._dtype is not logits._dtype:
            result = ops.cast(result, logits._dtype)
        return result, probs

    def mse_loss(self, input: Tensor, target: Tensor, reduction: str = "mean") -> Tensor:
        """``(input - target)^2``, averaged, summed or per element (same shapes, float)."""
        self._check_loss("mse_loss", input, target, reduction)
        ops = self._ops()
        diff = ops.sub(self._up(input), self._up(target))
        return self._reduce_loss(ops.mul(diff, diff), reduction, input._dtype)

    def binary_cross_entropy_with_logits(
        self,
        logits: Tensor,
        targets: Tensor,
        weight: Tensor | None = None,
        pos_weight: Tensor | None = None,
        reduction: str = "mean",
    ) -> Tensor:
        """``-w [pw y log sigmoid(x) + (1 - y) log(1 - sigmoid(x))]``, computed stably as
        ``(1 - y) x + (1 + (pw - 1) y) (log(1 + exp(-|x|)) + max(-x, 0))``; ``weight``
        broadcasts to the logits, ``pos_weight`` along the last (class) axis."""
        op = "binary_cross_entropy_with_logits"
        b = self.backend
        self._check_loss(op, logits, targets, reduction)
        for name, t in (("weight", weight), ("pos_weight", pos_weight)):
            if t is not None:
                check_tensor(b, t, name)
                check_float(t, op, name)
                if broadcast_shapes(t._shape, logits._shape, f"{op}: {name}") != logits._shape:
                    raise InvalidArgumentError(
                        f"{op}: {name} {t._shape} must broadcast to the logits {logits._shape}"
                    )
        ops = self._ops()
        x, y = self._up(logits), self._up(targets)
        softplus = ops.add(
            ops.log(ops.add(ops.exp(ops.neg(ops.abs(x))), 1.0)), ops.relu(ops.neg(x))
        )
        if pos_weight is not None:
            softplus = ops.mul(
                ops.add(ops.mul(ops.sub(self._up(pos_weight), 1.0), y), 1.0), softplus
            )
        loss = ops.add(ops.mul(ops.sub(1.0, y), x), softplus)
        if weight is not None:
            loss = ops.mul(loss, self._up(weight))
        return self._reduce_loss(loss, reduction, logits._dtype)

    def _check_loss(self, op: str, a: Tensor, t: Tensor, reduction: str) -> None:
        b = self.backend
        check_tensor(b, a, "input")
        check_tensor(b, t, "target")
        check_float(a, op, "input")
        check_float(t, op, "target")
        if a._shape != t._shape:
            raise InvalidArgumentError(
                f"{op}: input {a._shape} and target {t._shape} must have the same shape"
            )
        if reduction not in _REDUCTIONS:
            raise InvalidArgumentError(
                f"{op}: reduction must be 'mean', 'sum' or 'none'; got {reduction!r}"
            )

    def _reduce_loss(self, loss: Tensor, reduction: str, dtype: DType) -> Tensor:
        ops = self._ops()
        if reduction == "mean":
            loss = ops.mean(loss)  # NaN for no elements
        elif reduction == "sum":
            loss = ops.sum(loss)
        return loss if loss._dtype is dtype else ops.cast(loss, dtype)
