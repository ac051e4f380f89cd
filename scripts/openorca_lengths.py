"""Write tests/data/openorca_lengths.json: the prompt lengths of MLPerf's Llama 2 70B dataset (OpenOrca, 24,576
samples), for the validation rows that ran on it (prefill.plan.gpu_validation).

    PYTHONPATH=src python scripts/openorca_lengths.py path/to/llama2-70b-99.csv

The data: github:openshift-psap/performance-dashboard mlperf-data/summaries/llama2-70b-99.csv at commit
7cd1065d1e2c53ee745cbda08e2a8f13a42c93bb (2025-11-04), which its generate_dataset_summaries.py writes from MLCommons'
open_orca_gpt4_tokenized_llama.sampled_24576.pkl: one row per sample, `input_length` its `tok_input_length` (the
tokens the benchmark feeds the model: processorca.py's Llama 2 prompt template, tokenized, plus the 29871 it
appends) and `output_length` the GPT-4 reference answer's `tok_output_length`. Only the inputs are kept: the
reference answers are not what Llama 2 generates (MLPerf's reference: 294.45 generated tokens a sample).
"""

from __future__ import annotations

import collections
import csv
import json
import statistics
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "openorca_lengths.json"
SOURCE = (
    "github:openshift-psap/performance-dashboard mlperf-data/summaries/llama2-70b-99.csv at commit "
    "7cd1065d1e2c53ee745cbda08e2a8f13a42c93bb (2025-11-04)"
)


def main(path: str) -> None:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    prompts = [int(r["input_length"]) for r in rows]
    outputs = [int(r["output_length"]) for r in rows]
    # processorca.py --seqlen_limit=1024 keeps inputs and reference outputs under 1,024 tokens, outputs >= 3
    if len(prompts) != 24_576 or max(prompts) >= 1024 or max(outputs) >= 1024 or min(outputs) < 3:
        raise SystemExit(f"{path} is not MLPerf's 24,576 OpenOrca samples as processorca.py filters them")
    mean, median = statistics.fmean(prompts), statistics.median(prompts)
    about = (
        "MLPerf Inference's Llama 2 70B dataset (open_orca_gpt4_tokenized_llama.sampled_24576.pkl, "
        "mlcommons/inference language/llama2-70b/processorca.py --seqlen_limit=1024): each sample's input tokens "
        f"(tok_input_length, Llama 2 tokenizer), as {SOURCE} lists them, counted by length: [tokens, samples]. "
        f"Inputs average {mean:.1f} tokens (median {median:g}, {min(prompts)}..{max(prompts)}); the GPT-4 reference "
        f"answers in the same file ({statistics.fmean(outputs):.1f} tokens on average) are not kept, not being what "
        "Llama 2 generates. Written by scripts/openorca_lengths.py."
    )
    counts = sorted(collections.Counter(prompts).items())
    OUT.write_text(json.dumps({"about": about, "prompt_counts": counts}, separators=(",", ":")) + "\n")
    print(f"{len(prompts):,} samples, {len(counts)} lengths; input mean {mean:.1f}")


if __name__ == "__main__":
    main(sys.argv[1])
