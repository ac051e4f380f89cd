#!/usr/bin/env bash
# The README's CPU performance table: the embedded SmolLM2-135M-Instruct, P = 32..4096, bfloat16 and float32,
# ours compiled (Engine.compile), transformers and llama.cpp (when llama-cpp-python is installed) side by side
# on the same tokens and threads, calibrated on two prompt lengths (P = 128 and 4096).
# Takes about 15 minutes on 2 cores; run it on an otherwise idle machine.
# The chunk-size sweep: benchmarks/cpu.sh --prompt-lengths 4096 --dtypes bfloat16 --chunk-size 256,1024
#   benchmarks/cpu.sh                      # everything
#   benchmarks/cpu.sh --repeats 3          # extra arguments go to `prefill bench`
set -euo pipefail
cd "$(dirname "$0")/.."
PREFILL="${PREFILL:-}"
if [ -z "$PREFILL" ]; then
  if [ -x .venv/bin/prefill ]; then PREFILL=.venv/bin/prefill; else PREFILL=prefill; fi
fi
exec "$PREFILL" bench \
  --prompt-lengths 32,128,512,2048,4096 \
  --dtypes bfloat16,float32 \
  --repeats 5 \
  --peers transformers,llamacpp \
  --threads "${THREADS:-$(nproc)}" \
  --calibrate --calibrate-on 128,4096 \
  --compile \
  --out "${OUT:-bench-results/cpu}" \
  "$@"
