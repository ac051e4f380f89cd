#!/usr/bin/env bash
# One-GPU prefill check, no network, under 5 minutes: Llama-3-8B shapes with random bf16 weights built on the
# GPU, P = 512, 2048, 8192, MFU against the bf16 GEMM rate measured here, transformers on the same weights.
#   benchmarks/gpu.sh                               # CUDA
#   benchmarks/gpu.sh --device cpu --preset tiny    # the same script on tiny shapes, on the CPU
# Extra arguments go to `python -m prefill.bench.gpu` (--prompt-lengths, --repeats, --out, --no-transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" -m prefill.bench.gpu "$@"
