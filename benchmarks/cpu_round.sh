#!/usr/bin/env bash
# The CPU figures of this round's issues, in one go on a quiet machine (each script says what it measures):
# the serving core (issue 18), predictions (17), native weights vs llama.cpp (19), the KV store (20).
#   bash benchmarks/cpu_round.sh [OUT_DIR]
set -euo pipefail
out=${1:-bench-results/cpu-round}
mkdir -p "$out"
py=.venv/bin/python
$py -c "import torch; print('cpu:', torch.backends.cpu.get_cpu_capability(), 'threads:', torch.get_num_threads())"
$py benchmarks/serving_core.py --rounds 3 --out "$out/serving_core.json" | tee "$out/serving_core.txt"
$py benchmarks/predict.py --repeats 3 --no-save --out "$out/predict.json" | tee "$out/predict.txt"
$py benchmarks/kv_store.py --out "$out/kv_store.json" | tee "$out/kv_store.txt"
.venv/bin/prefill bench --llama-bench --repeats 3 --out "$out" | tee "$out/versus.txt"
