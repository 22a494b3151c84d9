#!/usr/bin/env bash
# eesd's GPU checks on a bare CUDA machine without network (see benchmarks/gpu/README.md).
# Usage: bash benchmarks/gpu/run.sh OUT [--only STEP ...] [--skip STEP ...]
set -euo pipefail
cd "$(dirname "$0")/../.."
exec python3 benchmarks/gpu/run.py "$@"
