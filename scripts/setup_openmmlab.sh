#!/usr/bin/env bash
# The OpenMMLab stack for the dense tasks, into .venv: mmengine 0.10.7, mmcv 2.1.0 with its
# compiled ops, mmsegmentation 1.2.2, mmdet 3.3.0 (+ ftfy, regex, pycocotools).
#
# mmcv 2.1.0 ships as source only, and two things stop it building against torch 2.14:
#   1. its setup.py imports pkg_resources, which setuptools 81+ no longer has: build with
#      setuptools<81 and --no-build-isolation (an isolated build would not see torch either);
#   2. it compiles with -std=c++14/-std=c++17, which torch 2.14's ATen headers refuse: the
#      flags are rewritten to -std=c++20.
# The wheel is built once (7 min 40 s measured on 2 cores) and kept in $LINVIT_CACHE/wheels
# (default ~/.cache/linvit), so a second set-up reinstalls it in seconds.
# FORCE_CUDA=1 (with CUDA_HOME and TORCH_CUDA_ARCH_LIST) builds the CUDA ops instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
CACHE=${LINVIT_CACHE:-$HOME/.cache/linvit}/wheels
FORCE_CUDA=${FORCE_CUDA:-0}
mkdir -p "$CACHE"

if "$PY" -c "import mmcv, mmcv.ops, mmseg, mmdet, mmengine" 2>/dev/null; then
  exit 0
fi
"$PY" -m pip install -q "mmengine==0.10.7" "setuptools<81" ninja
tag="cuda$FORCE_CUDA-torch$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')"
wheel=$(ls "$CACHE"/mmcv-2.1.0+"$tag"-*.whl 2>/dev/null | head -n 1 || true)
if [ -z "$wheel" ]; then
  echo "[setup] building mmcv 2.1.0 with its ops (once; it takes minutes)"
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT  # a failed build leaves nothing behind in /tmp
  "$PY" -m pip download -q --no-deps --no-build-isolation --no-binary :all: "mmcv==2.1.0" -d "$work"
  tar -xzf "$work"/mmcv-2.1.0.tar.gz -C "$work"
  sed -i -e 's/-std=c++14/-std=c++20/g' -e 's/-std=c++17/-std=c++20/g' "$work/mmcv-2.1.0/setup.py"
  (cd "$work/mmcv-2.1.0" && MMCV_WITH_OPS=1 FORCE_CUDA=$FORCE_CUDA MAX_JOBS=${MAX_JOBS:-2} \
     "$OLDPWD/$PY" -m pip wheel -q --no-build-isolation --no-deps . -w "$work/dist")
  built=$(ls "$work"/dist/mmcv-2.1.0-*.whl)
  # keep the build's identity (CUDA or not, torch version) in the cached file's name
  wheel="$CACHE/$(basename "$built" | sed "s/^mmcv-2.1.0-/mmcv-2.1.0+$tag-/")"
  cp "$built" "$wheel.tmp" && mv "$wheel.tmp" "$wheel"
  rm -rf "$work"
fi
# pip wants the wheel's own name (no local tag); the copy is removed whatever happens
wheeldir=$(mktemp -d)
trap 'rm -rf "$wheeldir"' EXIT
tmpwheel="$wheeldir/$(basename "$wheel" | sed "s/+$tag//")"
cp "$wheel" "$tmpwheel"
"$PY" -m pip install -q --no-deps "$tmpwheel"
rm -rf "$wheeldir"
"$PY" -m pip install -q "mmsegmentation==1.2.2" "mmdet==3.3.0" ftfy regex pycocotools
"$PY" -c "import mmcv.ops, mmseg.models, mmdet.models" >/dev/null
