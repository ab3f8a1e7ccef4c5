"""What a WebGPU adapter does without accelkit: a 4M-element f32 add as one plain WGSL kernel.

The floor under ``bench_webgpu.py``'s add: the kernel is the simplest there is (``vec4`` loads,
one or more vectors per invocation, no parameters), dispatched straight through wgpu-py and timed
from submit to a 16-byte read that waits for it, against NumPy's add in the same process. On a
software adapter (Mesa's llvmpipe, through OpenGL or Vulkan) this shows how far issue 13's
"add within 3x NumPy" is from what the adapter itself does.

    python benchmarks/wgpu_floor.py [--backend OpenGL|Vulkan|...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

N = 1 << 22


def main(backend: str | None) -> None:
    import wgpu

    adapters = wgpu.gpu.enumerate_adapters_sync()
    if backend:
        adapters = [a for a in adapters if backend.lower() in a.info["backend_type"].lower()]
    if not adapters:
        raise SystemExit(f"no WebGPU adapter{' for ' + backend if backend else ''} here")
    adapter = adapters[0]
    print(f"adapter: {adapter.info['device']} ({adapter.info['backend_type']})")
    device = adapter.request_device_sync()
    usage = wgpu.BufferUsage
    rng = np.random.default_rng(0)
    a, b = rng.random(N, np.float32), rng.random(N, np.float32)
    buf_a = device.create_buffer_with_data(data=a, usage=usage.STORAGE)
    buf_b = device.create_buffer_with_data(data=b, usage=usage.STORAGE)
    out = device.create_buffer(size=4 * N, usage=usage.STORAGE | usage.COPY_SRC)
    times = []
    for _ in range(7):
        t0 = time.perf_counter()
        np.add(a, b)
        times.append(time.perf_counter() - t0)
    t_np = min(times)
    for wg, per in ((64, 1), (256, 1), (256, 4), (64, 16)):
        src = f"""
@group(0) @binding(0) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> O: array<vec4<f32>>;
@compute @workgroup_size({wg})
fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {{
    let base = (g.y * nw.x * {wg}u + g.x) * {per}u;
    for (var j = 0u; j < {per}u; j = j + 1u) {{
        let i = base + j;
        if (i < arrayLength(&O)) {{ O[i] = A[i] + B[i]; }}
    }}
}}"""
        module = device.create_shader_module(code=src)
        pipe = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"}
        )
        entries = [
            {"binding": i, "resource": {"buffer": buf, "offset": 0, "size": buf.size}}
            for i, buf in enumerate((buf_a, buf_b, out))
        ]
        group = device.create_bind_group(layout=pipe.get_bind_group_layout(0), entries=entries)
        groups = (N // 4) // (wg * per)
        gx = min(groups, 65535)
        gy = -(-groups // gx)
        times = []
        for _ in range(7):
            t0 = time.perf_counter()
            enc = device.create_command_encoder()
            cpass = enc.begin_compute_pass()
            cpass.set_pipeline(pipe)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(gx, gy)
            cpass.end()
            device.queue.submit([enc.finish()])
            device.queue.read_buffer(out, 0, 16)  # waits for the dispatch
            times.append(time.perf_counter() - t0)
        got = np.frombuffer(device.queue.read_buffer(out), np.float32)
        assert np.array_equal(got, a + b), "the plain kernel's sum is wrong"
        t = min(times)
        print(f"  workgroup {wg:>3}, {per:>2} vec4 per invocation: {1e3 * t:6.1f} ms,"
              f" {t / t_np:5.1f}x NumPy's {1e3 * t_np:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", help="the adapter's backend type (OpenGL, Vulkan, ...)")
    main(parser.parse_args().backend)
