"""Turn the load-test's per-request timings into latency statistics, throughput and goodput.

Definitions (stated in every report, because servers and papers differ on them):
- TTFT: from sending the request to the first streamed chunk with non-empty text.
- ITL: gap between consecutive chunks with non-empty text (one chunk usually carries one token).
- TPOT: (E2E - TTFT) / (n_out - 1) per request with n_out >= 2.
- E2E: from sending the request to the end of its stream.
- n_out: the server's usage.completion_tokens when it reports one, else the number of content chunks.
- Throughput: successful requests / wall seconds, and their output tokens / wall seconds.
- Goodput: successful requests meeting every SLO given (TTFT <= slo_ttft, TPOT <= slo_tpot) / wall seconds.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from prefill.loadtest.client import RequestRecord

DEFINITIONS = {
    "TTFT": "request sent -> first streamed chunk with non-empty text",
    "ITL": "gap between consecutive chunks with non-empty text",
    "TPOT": "(E2E - TTFT) / (n_out - 1), requests with n_out >= 2",
    "E2E": "request sent -> end of stream",
    "n_out": "server usage.completion_tokens when reported, else number of content chunks",
    "throughput": "successful requests (and their output tokens) / wall seconds",
    "goodput": "successful requests meeting every SLO / wall seconds",
}


@dataclass(frozen=True)
class Stats:
    """Summary of one latency sample, seconds."""

    n: int
    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: list[float]) -> Stats | None:
        if not values:
            return None
        a = np.asarray(values, dtype=np.float64)
        p50, p90, p99 = np.percentile(a, [50, 90, 99])
        return cls(len(a), float(a.mean()), float(p50), float(p90), float(p99))


def ttft(rec: RequestRecord) -> float:
    return rec.first_content - rec.start


def e2e(rec: RequestRecord) -> float:
    return rec.end - rec.start


def tpot(rec: RequestRecord) -> float | None:
    """(E2E - TTFT) / (n_out - 1), seconds per output token after the first; None when n_out < 2."""
    n = rec.n_out
    return (rec.end - rec.first_content) / (n - 1) if n >= 2 else None


def itls(rec: RequestRecord) -> list[float]:
    return [b - a for a, b in itertools.pairwise(rec.chunk_times)]


def meets_slo(rec: RequestRecord, slo_ttft_s: float | None, slo_tpot_s: float | None) -> bool:
    """A successful request within every SLO given (a request with n_out < 2 has no TPOT to miss)."""
    if not rec.ok:
        return False
    if slo_ttft_s is not None and ttft(rec) > slo_ttft_s:
        return False
    per_token = tpot(rec)
    return not (slo_tpot_s is not None and per_token is not None and per_token > slo_tpot_s)


def summarize(
    records: list[RequestRecord],
    wall_s: float,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> dict:
    """The report as a JSON-ready dict: latency stats (seconds), throughput, goodput, errors."""
    ok = [r for r in records if r.ok]
    tpots = [x for x in (tpot(r) for r in ok) if x is not None]
    out_tokens = sum(r.n_out for r in ok)
    good = [r for r in ok if meets_slo(r, slo_ttft_s, slo_tpot_s)]
    stats = {
        "ttft_s": Stats.of([ttft(r) for r in ok]),
        "itl_s": Stats.of([x for r in ok for x in itls(r)]),
        "tpot_s": Stats.of(tpots),
        "e2e_s": Stats.of([e2e(r) for r in ok]),
    }
    prompt_tokens = [r.usage_prompt_tokens for r in ok if r.usage_prompt_tokens is not None]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            key = (r.error or "unknown")[:80]
            errors[key] = errors.get(key, 0) + 1
    return {
        "definitions": DEFINITIONS,
        "requests": len(records),
        "successful": len(ok),
        "failed": len(records) - len(ok),
        "errors": errors,
        "wall_s": wall_s,
        "output_tokens": out_tokens,
        "prompt_tokens_mean": float(np.mean(prompt_tokens)) if prompt_tokens else None,
        "cached_tokens": sum(r.cached_tokens or 0 for r in ok),
        "throughput_req_per_s": len(ok) / wall_s,
        "throughput_output_tok_per_s": out_tokens / wall_s,
        "slo": {"ttft_s": slo_ttft_s, "tpot_s": slo_tpot_s},
        "goodput_req_per_s": len(good) / wall_s,
        "slo_attainment": len(good) / len(records) if records else 0.0,
        "latency": {k: (asdict(v) if v else None) for k, v in stats.items()},
    }


def write_json(path: Path, config: dict, summary: dict, records: list[RequestRecord]) -> None:
    """The config, the summary and every request's raw timings."""
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"config": config, "summary": summary, "requests": [asdict(r) for r in records]}
    path.write_text(json.dumps(payload, indent=2, default=str))


def plot(path: Path, records: list[RequestRecord], title: str) -> None:
    """Four panels: TTFT and TPOT histograms, TTFT over the run, and E2E against output tokens."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in records if r.ok]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    ax = axes[0, 0]
    ax.hist([ttft(r) * 1e3 for r in ok], bins=30, color="tab:blue")
    ax.set(title="TTFT (request sent -> first content chunk)", xlabel="ms", ylabel="requests")
    ax = axes[0, 1]
    ax.hist([x * 1e3 for x in (tpot(r) for r in ok) if x is not None], bins=30, color="tab:orange")
    ax.set(title="TPOT = (E2E - TTFT) / (n_out - 1)", xlabel="ms per token", ylabel="requests")
    ax = axes[1, 0]
    ax.scatter([r.start for r in ok], [ttft(r) * 1e3 for r in ok], s=10)
    ax.set(title="TTFT over the run", xlabel="request start (s)", ylabel="TTFT (ms)")
    ax = axes[1, 1]
    ax.scatter([r.n_out for r in ok], [e2e(r) for r in ok], s=10, color="tab:green")
    ax.set(title="E2E latency vs output tokens", xlabel="n_out (tokens)", ylabel="E2E (s)")
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
