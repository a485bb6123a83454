#!/usr/bin/env bash
# The whole GPU check in one go, on a machine with an NVIDIA GPU, CuPy and PyTorch (no network needed):
#
#     bash benchmarks/gpu_run.sh [OUT]          # OUT: where results go (default $OUT, else ./gpu_out)
#
# 1. installs the project without downloading anything (or runs it from the source tree),
# 2. runs the whole test suite with the CuPy variants enabled (they skip where no GPU is found),
# 3. benchmarks/gpu.py: the ledger against CuPy's memory pool, step times on CuPy and PyTorch CUDA,
# 4. lesson 5 on CuPy (TINYGRAD_CKPT_BACKEND=cupy), writing its figures,
# 5. benchmarks/gpu.py again: the same step on NumPy, on the CPU (the slowest part, so last).
# Each part writes its log into OUT and the next part runs even if one fails.
set -u
out=${1:-${OUT:-gpu_out}}
mkdir -p "$out"
out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
stamp() { echo "[$(date +%T)] $*" | tee -a "$out/progress.log"; }

stamp "install"
python3 -m pip install -q --no-build-isolation --no-deps --no-index -e . >"$out/install.log" 2>&1 \
    || echo "pip install failed (see install.log): running from the source tree" | tee -a "$out/progress.log"
python3 -c "import cupy, torch; print('cupy', cupy.__version__, 'torch', torch.__version__, \
cupy.cuda.runtime.getDeviceCount(), 'GPU(s)')" 2>&1 | tee -a "$out/progress.log"

stamp "tests"
workers=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TEST_WORKERS:-8}")
timeout "${TEST_TIMEOUT:-360}" python3 -m pytest -q -p no:cacheprovider $workers -rfE >"$out/pytest.log" 2>&1
echo "pytest exit code $?" >>"$out/pytest.log"
tail -n 25 "$out/pytest.log" | tee -a "$out/progress.log"

stamp "gpu.py: pool, cupy, torch_cuda"
timeout "${GPU_TIMEOUT:-300}" python3 benchmarks/gpu.py --out "$out" --only pool,cupy,torch_cuda >"$out/gpu.log" 2>&1
echo "gpu.py exit code $?" >>"$out/gpu.log"
tail -n 30 "$out/gpu.log" | tee -a "$out/progress.log"

stamp "lesson 5 on CuPy"
TINYGRAD_CKPT_BACKEND=cupy timeout "${LESSON_TIMEOUT:-180}" python3 lessons/05_the_checkpoint_segment.py \
    --out "$out" >"$out/lesson05.log" 2>&1
echo "lesson 5 exit code $?" >>"$out/lesson05.log"
tail -n 8 "$out/lesson05.log" | tee -a "$out/progress.log"

stamp "gpu.py: numpy_cpu"
timeout "${CPU_TIMEOUT:-240}" python3 benchmarks/gpu.py --out "$out" --only numpy_cpu >>"$out/gpu.log" 2>&1
echo "gpu.py (numpy) exit code $?" >>"$out/gpu.log"
tail -n 14 "$out/gpu.log" | tee -a "$out/progress.log"
stamp "done"
