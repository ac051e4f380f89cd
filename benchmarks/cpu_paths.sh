#!/usr/bin/env bash
# Issue 42's figures on this CPU kind, in one go on a quiet machine (each script says what it measures):
# every serving path beside its prediction and auto's pick, ours (every path auto weighs) against llama.cpp on
# the same GGUF, 1 and 8 streams on each activation path, ITL at 64 and 4,096 tokens of context per K/V dtype,
# and the time model on the path auto serves. About 15 minutes on 2 cores. PUBLISH=1 also writes the
# llama-bench run as docs/results/<this CPU kind>/llama_bench.json.
#   bash benchmarks/cpu_paths.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results/cpu-paths}
mkdir -p "$out"
py=.venv/bin/python
export PYTHONPATH=src:benchmarks
$py -c "import torch; print('cpu:', torch.backends.cpu.get_cpu_capability(), 'threads:', torch.get_num_threads())"
$py benchmarks/serving_paths.py --rounds 3 --threads 2 --out "$out/serving_paths.json" | tee "$out/serving_paths.txt"
.venv/bin/prefill bench --llama-bench --threads 2 --repeats 3 --out "$out" | tee "$out/versus.txt"
$py benchmarks/activations_itl.py --rounds 3 --threads 2 --steps 20 --out "$out/activations_itl.json" \
  | tee "$out/activations_itl.txt"
$py benchmarks/kv_dtype_itl.py --rounds 3 --out "$out/kv_dtype_itl.json" | tee "$out/kv_dtype_itl.txt"
if [ -n "${PUBLISH:-}" ]; then
  $py -m prefill.bench.versus "$out/versus.json" --publish
fi
