#!/usr/bin/env bash
# The GPU checks, as one prepared script (for a machine with a CUDA GPU, e.g. the device tool):
#   1. tests: the Triton and fla kernels against the PyTorch reference, and one bf16-autocast
#      training step of every operator (tests/attention/test_autocast.py runs its cases on CUDA
#      too);
#   2. `linvit bench` on the GPU: every operator's core (Triton, fused PyTorch and the reference,
#      SDPA softmax) against tokens, with the goals, then images/s per operator for DeiT-T and
#      DeiT-S at 224 and 512 px (batch 64: at batch 8 an H200 only measured kernel launches).
#      Its ratios.md is the table the README is to quote;
#   3. the loader benchmark: linvit's ImageFolder loader against timm's create_loader, both
#      delivering to the GPU through timm's prefetcher (224 px, RandAugment);
#   4. the training step (scripts/bench_step.py): linvit's against a bare timm loop, eager,
#      fused AdamW and compiled, DeiT-S at 224 px under bf16 autocast;
#   5. the demo (README) end to end on the GPU, amp on, where Fashion-MNIST is found (DATA_ROOT,
#      else Debian's folder).
# Usage: scripts/bench_gpu.sh [OUT]   (default results/bench_gpu; each part's output is printed
# and kept in OUT/<part>.log; a failing part does not stop the others, the exit status says)
#   PYTHON=python3   an interpreter that already has torch, timm and linvit's needs (src/ is put on
#                    PYTHONPATH); without it, .venv (set up by scripts/setup.sh when missing)
#   PART_TIMEOUT=S   stop any part after S seconds (default: no limit); TIMEOUT_<part>=S for one
#                    part (parts: tests, bench, loader, step, demo). A part stopped this way gets
#                    SIGINT first, so pytest still names the tests that failed before it
#   PARTS="a b"      run only these parts, in this order (default: all, in the order above);
#                    an unknown name exits with status 2 before anything runs
#   BENCH_ARGS="k=v" more overrides of `linvit bench` (they win), e.g. "tokens=[4096] repeats=1"
#                    where the device time is short; values must not contain spaces
# The benchmark lets float32 matmuls use TF32 (tf32=true), as GPU training does; the kernel
# tests run in IEEE float32 (torch's default) and compare at float32 tolerances.
set -uo pipefail
cd "$(dirname "$0")/.."
parts=()
read -ra parts <<< "${PARTS:-tests bench loader step demo}"   # split at spaces, no globbing
for name in "${parts[@]}"; do   # every name checked before anything is set up or run
  case $name in
    tests|bench|loader|step|demo) ;;
    *) echo "bench_gpu: unknown part '$name' in PARTS (tests, bench, loader, step, demo)" >&2
       exit 2 ;;
  esac
done
out=${1:-results/bench_gpu}
if [ -n "${PYTHON:-}" ]; then
  py=$PYTHON
  export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
else
  [ -x .venv/bin/python ] || ./scripts/setup.sh || exit 1
  py=.venv/bin/python
fi
"$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device'" || exit 1
mkdir -p "$out"
failed=()

part() {   # part NAME COMMAND...: run it (time-limited by PART_TIMEOUT), log it, note a failure
  local name=$1; shift
  echo "=== $name: $*"
  local start=$SECONDS
  local limit="TIMEOUT_$name"
  timeout -s INT -k 15 "${!limit:-${PART_TIMEOUT:-0}}" "$@" 2>&1 | tee "$out/$name.log"
  local rc=${PIPESTATUS[0]}
  echo "=== $name: exit $rc after $((SECONDS - start)) s"
  [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
}

# The interpreter test is left out: on a GPU tests/ops/interpreted runs compiled, directly. The
# new operators' fla paths are held to their chunked paths only where fla is installed
# (pip install -e '.[fla]'); without it those tests are skipped and say so (-rfEs). -v names each
# test as it ends, so a part stopped by its time limit still shows how far it got. -k keeps the
# kernel and CUDA cases (and a few cheap CPU ones whose names match): the rest are the CI's, and
# on a short lease each Triton and fla compile costs seconds.
run_tests() {
  local workers=$(( $(nproc) < 8 ? $(nproc) : 8 ))
  part tests "$py" -m pytest -v -rfEs -p no:cacheprovider -o addopts="" -n "$workers" \
    --dist loadfile -k "triton or cuda or fla" \
    --deselect tests/ops/test_kernels.py::test_triton_kernels_under_the_interpreter \
    tests/ops/interpreted tests/ops/test_kernels.py tests/ops/test_gated_scan.py \
    tests/ops/test_delta_rule.py tests/attention/test_autocast.py
}

# Cores at batch 8 from N=4096: at B=1, H=6 an H200 timed launches (the linear cores took the
# same ~1 ms from N=1024 to 16384). The token-by-token references of gla, mamba2 and deltanet
# (timed up to N=1024 only, seconds a call on a GPU) are left out so.
run_bench() {
  local extra=()
  read -ra extra <<< "${BENCH_ARGS:-}"   # split at spaces only: no glob expansion of [..]
  part bench "$py" -m linvit.cli bench -o "$out/bench" --rerun run.device=cuda tf32=true \
    "tokens=[4096,16384]" softmax_max_tokens=16384 batch=8 min_run_time=0.15 repeats=3 \
    "models.sizes=[deit_t,deit_s]" "models.resolutions=[224,512]" models.batch=64 \
    models.min_run_time=0.15 ${extra[@]+"${extra[@]}"}   # (empty-safe before bash 4.4)
}

run_loader() {
  part loader "$py" scripts/bench_loader.py --device cuda --workers "$(nproc)" --batch 128 \
    --images 2048 --repeats 3
}

run_step() {
  part step "$py" scripts/bench_step.py --device cuda --size deit_s --img-size 224 \
    --in-chans 3 --batch 128 --operator linear --steps 10 --repeats 5
}

run_demo() {
  local fmnist=${DATA_ROOT:-/usr/share/datasets/fashion-mnist}
  if [ -f "$fmnist/train-images-idx3-ubyte.gz" ]; then
    part demo "$py" -m linvit.cli demo -o "$out/demo" run.device=cuda "data.root=$fmnist"
  else
    echo "=== demo: skipped (no Fashion-MNIST at $fmnist; set DATA_ROOT)"
  fi
}

for name in "${parts[@]}"; do "run_$name"; done

if [ ${#failed[@]} -gt 0 ]; then
  echo "bench_gpu: failed: ${failed[*]}" >&2
  exit 1
fi
echo "bench_gpu: every part ran; outputs in $out"
