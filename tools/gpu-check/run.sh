#!/usr/bin/env bash
# The GPU check, on the GPU machine (no registry there): installs the wheels that prepare.sh
# carried in .gpu/ beside the image's CuPy and PyTorch, then runs the steps named in STEPS (default:
# all, in the order below), each capped, the whole run stopped at BUDGET seconds. Writes
# $OUT/summary.txt and $OUT/all.tgz (every step's full log). Run from the project's root.
# In order of what a short budget should keep: correctness first, then timing.
ALL_STEPS="env devices dead_block cuda_tests conformance conformance_inline sanitizer service service_inline demo doctor profile bench attention_bench flash_bench webgpu_bench webgpu_conformance racecheck racecheck_decode synccheck"
STEPS=${STEPS:-$ALL_STEPS}
export PYTHONUNBUFFERED=1
DEADLINE=$(( $(date +%s) + ${BUDGET:-500} ))
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT/logs"
ROOT=$PWD
PY=${PY:-python3}
NPROC=${NPROC:-12}
$PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .gpu/whl/*.whl >"$OUT/logs/install.txt" 2>&1 || { cat "$OUT/logs/install.txt"; exit 1; }
export PYTHONPATH=/tmp/site
for f in .gpu/gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig 2>/dev/null
export ACCELKIT_CACHE_DIR=/tmp/accelkit-cache
step() {  # step NAME CAP CMD...: run CMD with a cap, log it, add its tail to the summary
  local name=$1 cap=$2; shift 2
  case " $STEPS " in *" $name "*) ;; *) return ;; esac
  local left=$(( DEADLINE - $(date +%s) ))
  [ "$cap" -gt "$left" ] && cap=$left
  if [ "$cap" -lt 5 ]; then echo "=== $name: skipped, no time left" >>"$OUT/summary.txt"; return; fi
  local t0=$(date +%s)
  echo "=== $name (cap ${cap}s)" | tee -a "$OUT/summary.txt"
  timeout -s INT -k 20 "$cap" "$@" >"$OUT/logs/$name.txt" 2>&1; local rc=$?
  echo "    rc=$rc in $(( $(date +%s) - t0 ))s; last lines:" >>"$OUT/summary.txt"
  tail -n "${TAILN:-8}" "$OUT/logs/$name.txt" | cut -c1-400 | sed 's/^/    /' >>"$OUT/summary.txt"
}
env_info() {
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; nproc
  $PY -c "import sys, numpy, pydantic; print(sys.version); print('numpy', numpy.__version__, 'pydantic', pydantic.__version__)"
  $PY -c "import cupy; print('cupy', cupy.__version__, 'runtime', cupy.cuda.runtime.runtimeGetVersion())"
  $PY -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
  $PY -c "from accelkit_cuda.cudnn_attention import load_frontend as f; m, why = f(); print('cudnn', why or (m.__version__, m.backend_version()))"
  ldconfig -p | grep -i libvulkan | head -2
}
export -f env_info; export PY
TAILN=12 step env 30 bash -c env_info
step devices 30 $PY -m accelkit devices
step dead_block 60 $PY .gpu/dead_block.py
# the plugin's GPU tests (marked gpu); its stand-in tests are CI's (all 901 take over 200 s here)
TAILN=20 step cuda_tests 200 $PY -m pytest ${CUDA_TESTS:-plugins/accelkit-cuda/tests -m gpu} -v -p no:cacheprovider -rfE --timeout 60
cd /tmp
TAILN=20 step conformance 240 $PY -m pytest --pyargs accelkit.testing --accelkit-backend cuda -v -p no:cacheprovider -rfE --timeout 90 -n "$NPROC"
# the same with plain launches made on the loop's thread (ACCELKIT_CUDA_INLINE, off by default)
TAILN=12 step conformance_inline 240 env ACCELKIT_CUDA_INLINE=1 $PY -m pytest --pyargs accelkit.testing --accelkit-backend cuda -q -p no:cacheprovider -rfE --timeout 90 -n "$NPROC"
# the fuzz properties run under one event loop each (one_loop): every property, once
sanitize() {  # compute-sanitizer's TOOL over the fuzz properties on cuda
  compute-sanitizer --tool "$1" --error-exitcode 3 $PY -m pytest --pyargs accelkit.testing.test_fuzz --accelkit-backend cuda -x -q -p no:cacheprovider
}
export -f sanitize
sanitize_decode() {  # compute-sanitizer's TOOL over the split-KV decode kernels, plain and pipelined
  # (one event loop; the other gated kernels off, so that only decode's check child runs)
  ACCELKIT_CUDA_FLASH2=0 ACCELKIT_CUDA_FLASH_SIMT=0 compute-sanitizer --tool "$1" --error-exitcode 3 \
    $PY -m pytest "$ROOT/plugins/accelkit-cuda/tests/test_gpu_cudnn.py" -k "split_kv and asyncio and not bf16" -x -q -p no:cacheprovider --timeout 200
}
export -f sanitize_decode
export ROOT
TAILN=20 step sanitizer 150 bash -c 'sanitize memcheck'
cd "$ROOT"
TAILN=40 step service 120 env ACCELKIT_STRICT_TIMING=1 $PY -m pytest tests/test_service.py -v -s -p no:cacheprovider -rfE
TAILN=24 step service_inline 120 env ACCELKIT_STRICT_TIMING=1 ACCELKIT_CUDA_INLINE=1 $PY -m pytest tests/test_service.py -v -s -p no:cacheprovider -rfE -k cuda
TAILN=12 step demo 120 $PY -m accelkit demo
step doctor 90 $PY -m accelkit doctor
# where the eager block's time goes: closures, cProfile inside them, every kernel (about 30 s)
TAILN=120 step profile 90 $PY benchmarks/profile_cuda_block.py
# its summary (about 24 lines: GEMMs, attention, host times, the block, its step timelines)
TAILN=40 step bench 120 $PY benchmarks/bench_cuda.py
TAILN=28 step attention_bench 120 $PY benchmarks/bench_cuda_attention.py
# the tensor-core attention kernel vs the warp-per-row kernel vs SDPA (about 20 s)
TAILN=10 step flash_bench 60 $PY benchmarks/bench_cuda_flash.py
TAILN=16 step webgpu_bench 90 $PY benchmarks/bench_webgpu.py
cd /tmp
TAILN=8 step webgpu_conformance 240 $PY -m pytest --pyargs accelkit.testing --accelkit-backend webgpu -q -p no:cacheprovider -rfE --timeout 90 -n "$NPROC"
# compute-sanitizer's shared-memory race and barrier checks over the fuzz properties (issue 27
# asked for them beside memcheck; never run yet: last, so that a default budget keeps the rest)
TAILN=12 step racecheck 150 bash -c 'sanitize racecheck'
TAILN=12 step racecheck_decode 240 bash -c 'sanitize_decode racecheck'
TAILN=12 step synccheck 150 bash -c 'sanitize synccheck'
echo "=== done" >>"$OUT/summary.txt"
cd "$OUT" && tar -czf all.tgz logs && rm -rf logs
cat "$OUT/summary.txt"
