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

        async def park_in_cycle() -> None:
            t = f.from_host(np.zeros(0, np.float32))  # 0 bytes -> a 64 B block, nothing launched
            await b.synchronize()  # its cudaMalloc runs on the submission thread
            try:
                raise ValueError("refused")
            except ValueError as e:
                err = e  # err -> __traceback__ -> this frame -> err (and t): a reference cycle

        await park_in_cycle()
        gc.collect()  # one pass: DeviceBuffer.__del__ puts the buffer back in the pool,
        #               Block.__del__ cudaFrees the block and sets Block.ptr = 0
        block = mm.allocate(8)
        await b.synchronize()  # the allocation, if the pool had none, runs on the submission thread
        ptr = block.handle.ptr
        print("next 64 B block:", hex(ptr))  # 0x0 before the fix
        assert ptr != 0, "the pool handed out a freed block"
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
