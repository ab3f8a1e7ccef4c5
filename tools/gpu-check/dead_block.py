"""The dead-block race of 2026-11-26, on a GPU: a tensor that dies in a reference cycle must not
leave a freed block in the pool. Before the fix the next 64 B block was 0x0 and the argmin failed
with cudaErrorInvalidValue (with 'bool': a sticky illegal address). Now: a live address, and the
ops give NumPy's answers.   python tools/gpu-check/dead_block.py [bool]"""
import gc, sys
import anyio
import numpy as np
import accelkit
from accelkit import DType


async def main() -> None:
    async with accelkit.open_backend("cuda") as b:
        f, ops, mm = b.tensor_factory, b.tensor_ops, b.memory_manager

        def park_in_cycle() -> None:
            t = f.from_host(np.zeros(0, np.float32))  # 0 bytes -> a 64 B block, nothing launched
            try:
                raise ValueError("refused")
            except ValueError as e:
                err = e  # err -> __traceback__ -> this frame -> err (and t): a reference cycle

        park_in_cycle()
        gc.collect()  # before the fix, one pass freed the block and put its buffer back in the pool
        block = mm.allocate(8)  # its cudaMalloc, if any, is queued on the submission thread
        await mm.copy_htod(block, np.array([1.5, -2.5], np.float32))
        back = np.empty(2, np.float32)
        await mm.copy_dtoh(back, block)
        print("next 64 B block:", hex(block.handle.ptr), back)  # 0x0 and an error before the fix
        assert block.handle.ptr != 0 and back.tolist() == [1.5, -2.5]
        if sys.argv[1:] == ["bool"]:
            x = f.from_host(np.ones(9))  # 72 B -> 128 B class, healthy
            got = await ops.cast(x, DType.BOOL).to_host()
            assert got.all(), got
        else:
            x = f.from_host(np.full((1, 17), 5.0, np.float32))  # 68 B -> 128 B class, healthy
            got = await ops.argmin(x, axis=1).to_host()
            assert got.tolist() == [0], got
        print("ok: a live block, and the op's answer is NumPy's")


anyio.run(main)
