"""``accelkit.testing``: the conformance suite every backend must pass, shipped with accelkit.

Run it against one installed backend from any folder::

    pytest --pyargs accelkit.testing --accelkit-backend NAME

(or set ``ACCELKIT_TEST_BACKEND=NAME``; without either, every installed backend plugin that
reports a device is tested). Every op of TensorOps, TensorFactory and KernelOps is checked
against NumPy references with one tolerance table (:mod:`accelkit.testing.checks`), every async
path under asyncio and under trio, bad input on every op, and the backend lifecycle. The
``--accelkit-backend`` option comes from accelkit's pytest plugin (:mod:`accelkit.testing.plugin`,
registered under the ``pytest11`` entry point), which adds nothing else to a pytest run.
"""
