"""Write tests/data/openorca_lengths.json and tests/data/cnndm_lengths.json: the prompt lengths of MLPerf
Inference's Llama 2 70B dataset (OpenOrca, 24,576 samples) and Llama 3.1 8B dataset (CNN/DailyMail, 13,368
samples), for the validation rows that ran on them (prefill.plan.gpu_validation).

    PYTHONPATH=src python scripts/mlperf_lengths.py path/to/performance-dashboard/mlperf-data/summaries

The data: github:openshift-psap/performance-dashboard mlperf-data/summaries/ at commit
7cd1065d1e2c53ee745cbda08e2a8f13a42c93bb (2025-11-04), one row per sample, written by its
generate_dataset_summaries.py from MLCommons' own files. `input_length` is what the benchmark feeds the model:
OpenOrca's `tok_input_length` in open_orca_gpt4_tokenized_llama.sampled_24576.pkl (processorca.py's Llama 2 prompt
template, tokenized, plus the 29871 it appends) and the length of CNN/DailyMail's `tok_input` in cnn_eval.json
(the Llama 3.1 chat template, tokenized). Only the inputs are kept: OpenOrca's `output_length` is the GPT-4
reference answer, not what Llama 2 generates (the reference run: 294.45 generated tokens a sample), and
CNN/DailyMail's is the reference summary's characters over 4.
"""

from __future__ import annotations

import collections
import csv
import json
import statistics
import sys
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "tests" / "data"
SOURCE = "github:openshift-psap/performance-dashboard mlperf-data/summaries/{} at commit 7cd1065d (2025-11-04)"
# name: (the dashboard's file, MLPerf's file and the rule that made it, samples, the cap the rule keeps inputs under)
SETS = {
    "openorca": (
        "llama2-70b-99.csv",
        "MLPerf Inference's Llama 2 70B dataset (open_orca_gpt4_tokenized_llama.sampled_24576.pkl, mlcommons/inference "
        "language/llama2-70b/processorca.py --seqlen_limit=1024, Llama 2 tokenizer): each sample's tok_input_length",
        24_576,
        1024,
    ),
    "cnndm": (
        "llama3-1-8b-datacenter.csv",
        "MLPerf Inference's Llama 3.1 8B dataset (CNN/DailyMail validation, cnn_eval.json, mlcommons/inference "
        "language/llama3.1-8b, the Llama 3.1 chat template): the length of each sample's tok_input",
        13_368,
        None,
    ),
}


def write(name: str, summaries: Path) -> None:
    csv_name, what, samples, cap = SETS[name]
    with open(summaries / csv_name, newline="") as f:
        prompts = [int(r["input_length"]) for r in csv.DictReader(f)]
    if len(prompts) != samples or (cap and max(prompts) >= cap):
        raise SystemExit(f"{csv_name} is not MLPerf's {samples:,} samples (inputs under {cap})")
    mean, median = statistics.fmean(prompts), statistics.median(prompts)
    about = (
        f"{what}, as {SOURCE.format(csv_name)} lists them, counted by length: [tokens, samples]. Inputs average "
        f"{mean:.1f} tokens (median {median:g}, {min(prompts)}..{max(prompts)}). Written by scripts/mlperf_lengths.py."
    )
    counts = sorted(collections.Counter(prompts).items())
    out = DATA / f"{name}_lengths.json"
    out.write_text(json.dumps({"about": about, "prompt_counts": counts}, separators=(",", ":")) + "\n")
    print(f"{out.name}: {len(prompts):,} samples, {len(counts)} lengths; input mean {mean:.1f}")


if __name__ == "__main__":
    for dataset in SETS:
        write(dataset, Path(sys.argv[1]))
