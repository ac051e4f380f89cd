#!/usr/bin/env bash
# The README's CPU performance table: the embedded SmolLM2-135M-Instruct, P = 32..4096, in the dtypes native on
# this CPU (float32 everywhere, bfloat16 where AVX-512-BF16 / AMX make it native), ours eager and compiled
# (Engine.compile), transformers, and llama.cpp (when llama-cpp-python is installed) on the GGUF as shipped (Q4_1)
# and on F32 / BF16 copies of the same weights, side by side on the same tokens and threads, calibrated on two
# prompt lengths (P = 128 and 4096). It prints its estimated duration before it starts (about 15-30 minutes on
# 2 cores); run it on an otherwise idle machine. PUBLISH=1 also writes the run's table as the results file
# docs/results/<this CPU kind>/bench.json (python -m prefill.bench.report BENCH_JSON --publish).
# The chunk-size sweep: benchmarks/cpu.sh --prompt-lengths 4096 --chunk-size 256,1024
#   benchmarks/cpu.sh                                     # everything
#   benchmarks/cpu.sh --prompt-lengths 128,512,1024 --repeats 3   # a shorter run; extra arguments go to `prefill bench`
set -euo pipefail
cd "$(dirname "$0")/.."
PREFILL="${PREFILL:-}"
if [ -z "$PREFILL" ]; then
  if [ -x .venv/bin/prefill ]; then PREFILL=.venv/bin/prefill; else PREFILL=prefill; fi
fi
out="${OUT:-bench-results/cpu}"
"$PREFILL" bench \
  --prompt-lengths 32,128,512,2048,4096 \
  --repeats 5 \
  --peers transformers,llamacpp \
  --threads "${THREADS:-$(nproc)}" \
  --calibrate --calibrate-on 128,4096 \
  --compile \
  --out "$out" \
  "$@"
if [ -n "${PUBLISH:-}" ]; then
  PY=python3
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
  "$PY" -m prefill.bench.report "$out/bench.json" --publish
fi
