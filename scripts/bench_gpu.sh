#!/usr/bin/env bash
# The GPU checks, as one prepared script (for a machine with a CUDA GPU, e.g. the device tool):
#   1. the Triton and fla kernels against the PyTorch reference, and one bf16-autocast training
#      step of every operator (tests/attention/test_autocast.py runs its cases on CUDA too);
#   2. the loader benchmark: linvit's ImageFolder loader against timm's create_loader, both
#      delivering to the GPU through timm's prefetcher (224 px, RandAugment);
#   3. the training step (scripts/bench_step.py): linvit's against a bare timm loop, eager,
#      fused AdamW and compiled, DeiT-S at 224 px under bf16 autocast;
#   4. `linvit bench` on the GPU: every operator's core (Triton, fused PyTorch and the reference,
#      SDPA softmax) against tokens, with the goals, then images/s per operator for DeiT-T and
#      DeiT-S at 224 to 1024 px. Its ratios.md is the table the README quotes.
# Usage: scripts/bench_gpu.sh [OUT]   (default results/bench_gpu; everything is also printed)
# The benchmark lets float32 matmuls use TF32 (tf32=true), as GPU training does; the kernel
# tests run in IEEE float32 (torch's default) and compare at float32 tolerances.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-results/bench_gpu}
[ -x .venv/bin/python ] || ./scripts/setup.sh
.venv/bin/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'"
mkdir -p "$out"
# the new operators' fla paths are held to their chunked paths only where fla is installed
# (pip install -e '.[fla]'); without it those tests are skipped and say so (-rs)
.venv/bin/python -m pytest -q -rs -p no:cacheprovider tests/ops/interpreted tests/ops/test_kernels.py \
  tests/ops/test_gated_scan.py tests/ops/test_delta_rule.py tests/attention/test_ttt.py \
  tests/attention/test_autocast.py
.venv/bin/python scripts/bench_loader.py --device cuda --workers "$(nproc)" --batch 128 \
  --images 2048 --repeats 3 | tee "$out/loader.txt"
.venv/bin/python scripts/bench_step.py --device cuda --size deit_s --img-size 224 --in-chans 3 \
  --batch 128 --operator linear --steps 10 --repeats 5 | tee "$out/step.txt"
.venv/bin/linvit bench -o "$out/bench" --rerun run.device=cuda "tokens=[1024,4096,16384,65536]" \
  softmax_max_tokens=65536 reference_max_tokens=65536 \
  "models.sizes=[deit_t,deit_s]" models.batch=8 tf32=true
