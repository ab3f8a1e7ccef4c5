#!/usr/bin/env bash
# Prepare a GPU check of the working tree, here (a machine with the package registries).
#
# Run from the project's root:  bash tools/gpu-check/prepare.sh [EXTRA_REQUIREMENT ...]
# It writes .gpu/ (ignored through .git/info/exclude): wheels of accelkit and every plugin, the
# runtime dependencies the GPU machine's image lacks (built for its Python 3.12), the Vulkan loader
# for WebGPU, and run.sh. Extra arguments are more requirements to carry (e.g.
# "nvidia-cudnn-frontend<1.29"); their own dependencies are not followed: name each.
# Then run .gpu/run.sh on the GPU machine, from a copy of the working tree (README.md here).
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
here=$(cd "$(dirname "$0")" && pwd)
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/whl .gpu/gl
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .gpu/whl "$@" 2>&1 | grep -v WARNING || true
}
# What the image ('cuda': Python 3.12, CuPy 14 for CUDA 13, PyTorch, NumPy, SciPy, pytest,
# pytest-xdist, hypothesis, httpx, h11, click, ml-dtypes, onnx) lacks or has too old for accelkit.
dl pydantic pydantic_core annotated_types typing_inspection "typing_extensions>=4.16" "anyio>=4.4" \
   sniffio numexpr trio outcome pytest-timeout uvicorn starlette wgpu cffi pycparser rendercanvas
# The cuDNN frontend (attention on cuDNN): a wheel of about 5.5 MiB; its cuDNN library is the one the
# image's PyTorch installed (nvidia-cudnn-cu13), which accelkit_cuda.cudnn_attention loads.
dl "nvidia-cudnn-frontend<1.29"
[ $# -gt 0 ] && dl "$@"
python3 -m pip wheel -q --no-deps -w .gpu/whl . plugins/*/ 2>&1 | grep -v WARNING || true
o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
mkdir -p /tmp/amd64/partial
apt-get $o update >/dev/null 2>&1 || true
(cd .gpu/gl && apt-get $o download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null 2>&1) \
  || echo "note: the Vulkan loader could not be fetched; WebGPU steps may find no GPU adapter"
cp "$here/run.sh" "$here/dead_block.py" .gpu/
echo "prepared .gpu ($(du -sh .gpu | cut -f1)):"
ls .gpu/whl | sed 's/^/  /'
cat <<MSG

On the GPU machine, from the project's root with .gpu/ beside it:
  bash .gpu/run.sh                 (about 8 minutes; STEPS="cuda_tests conformance" for a subset)
Steps, in order (each capped; the whole run stops at BUDGET seconds, default 500):
  $(sed -n 's/^ALL_STEPS="\(.*\)"$/\1/p' "$here/run.sh")
Results: \$OUT/summary.txt (each step's exit code, time and last lines) and \$OUT/all.tgz (every log).
MSG
