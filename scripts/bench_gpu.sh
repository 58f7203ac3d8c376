#!/usr/bin/env bash
# The GPU checks of the fast linear attention, as one prepared script (for a machine with a CUDA
# GPU, e.g. the device tool): the Triton kernels against the PyTorch reference on the GPU, then
# `linvit bench` on the GPU (Triton, fused PyTorch and einsum reference backends, SDPA softmax).
# Usage: scripts/bench_gpu.sh [OUT]   (default results/bench_gpu; prints the ratio table)
# The benchmark lets float32 matmuls use TF32 (tf32=true), as GPU training does; the kernel
# tests run in IEEE float32 (torch's default) and compare at float32 tolerances.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench_gpu}
[ -x .venv/bin/python ] || ./scripts/setup.sh
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
# the new operators' fla paths are held to their chunked paths only where fla is installed
# (pip install -e '.[fla]'); without it those tests are skipped and say so (-rs)
.venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/ops/interpreted tests/ops/test_kernels.py \
  tests/ops/test_gated_scan.py tests/ops/test_delta_rule.py tests/attention/test_ttt.py
.venv/bin/linvit bench -o "$out" --rerun run.device=cuda "tokens=[1024,4096,16384,65536]" \
  softmax_max_tokens=65536 reference_max_tokens=65536 \
  "models.sizes=[deit_t,deit_s]" models.batch=8 tf32=true
