"""Disaggregation checked against DistServe's Figure 6 (tests/data/published_disagg.json): the goodput per GPU of
a colocated replica, a prefill-only and a decode-only instance, and 2P1D, each the highest Poisson rate whose P90
TTFT and P90 TPOT meet the published SLO.

    table = render_table(goodputs())   # minutes: each goodput is bisected (scripts/disagg_validation.py)

The colocated replica and both pools run vLLM 0.2's scheduler as DistServe's baseline ran it (a step with prefill
work runs only that; 256 sequences; a budget of max(max_model_len, 2048) = 2,048 tokens for OPT-13B) on the
catalog A100 with the engines' shared efficiencies, Llama 2 13B's shapes for the 13B model, K/V over NVLink 3.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from prefill.costmodel.engines import get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.links import get_link
from prefill.costmodel.specs import load_spec
from prefill.loadtest.client import PromptLengths
from prefill.loadtest.report import summarize
from prefill.plan.disagg import Disagg, run_metered, simulate_disagg
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.simulate import SimRequest, poisson_trace

DATA = Path(__file__).resolve().parents[3] / "tests" / "data"
REQUESTS = 150


def fig6() -> dict:
    """The published figure: workload, SLO, goodputs per GPU, source."""
    return json.loads((DATA / "published_disagg.json").read_text())["distserve_fig6"]


def fig6_server(row: dict) -> GpuServer:
    """One A100 running the 13B model under vLLM 0.2's scheduler (see the module docstring)."""
    spec = load_spec(str(DATA / "llama-2-13b" / "config.json"))
    v02 = dataclasses.replace(get_engine("vllm"), mixed=False, decode_in_budget=False, token_budget=2048, max_seqs=256)
    return GpuServer.on(spec, get_hardware(row["hardware"]), v02, "float16", None, 1)


def p90s(records, wall_s) -> tuple[float, float]:
    """P90 TTFT and P90 TPOT (s) of a run."""
    lat = summarize(records, wall_s)["latency"]
    return lat["ttft_s"]["p90"], (lat["tpot_s"] or {}).get("p90", 0.0)


def deployments(row: dict, server: GpuServer, requests: int = REQUESTS) -> dict:
    """Each deployment as a function of the offered rate: (P90 TTFT, P90 TPOT) of its run."""
    P, n = row["workload"]["prompt_tokens"], row["workload"]["output_tokens"]

    def trace(rate):
        return poisson_trace(rate, requests, PromptLengths(P, P), PromptLengths(n, n))

    def colocated(rate):
        r, _ = run_metered(server, trace(rate))
        return p90s(r.records, r.wall_s)

    def prefill_only(rate):
        r, _ = run_metered(server, [SimRequest(q.arrival_s, P, 1) for q in trace(rate)])
        return p90s(r.records, r.wall_s)[0], 0.0

    def decode_only(rate):
        r, _ = run_metered(server, [SimRequest(q.arrival_s, P + 1, n - 1) for q in trace(rate)], arrived=True)
        return 0.0, p90s(r.records, r.wall_s)[1]

    def two_one(rate):
        r = simulate_disagg(Disagg(server, server, 2, 1, get_link("nvlink3")), trace(rate))
        return p90s(r.records, r.wall_s)

    return {"colocated": colocated, "prefill_only": prefill_only, "decode_only": decode_only, "2P1D": two_one}


def highest_rate(meets, lo: float = 0.25, hi: float = 64.0) -> float:
    """The highest rate in [lo, hi] with meets(rate), bisected geometrically to 5% (assumed monotone); 0 if none."""
    if not meets(lo):
        return 0.0
    while hi / lo > 1.05:
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo


def goodputs(row: dict | None = None) -> dict[str, float]:
    """Each deployment's simulated goodput per GPU (2P1D's over its 3 GPUs)."""
    row = row or fig6()
    slo = row["slo"]
    runs = deployments(row, fig6_server(row))

    def meets(run):
        def ok(rate):
            ttft, tpot = run(rate)
            return ttft <= slo["ttft_p90_s"] and tpot <= slo["tpot_p90_s"]

        return ok

    return {k: highest_rate(meets(run)) / (3 if k == "2P1D" else 1) for k, run in runs.items()}


def render_table(ours: dict[str, float], row: dict | None = None) -> str:
    """The published goodputs beside the simulated ones, and the 2P1D gain over colocated, as markdown."""
    published = (row or fig6())["goodput_req_s_per_gpu"]
    lines = [
        "| Deployment | Published req/s per GPU | Simulated req/s per GPU | Ratio |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {k} | {v:g} | {ours[k]:.2f} | {ours[k] / v:.2f} |" for k, v in published.items()]
    theirs, mine = published["2P1D"] / published["colocated"], ours["2P1D"] / ours["colocated"]
    gain = f"published {theirs:.2f}x, simulated {mine:.2f}x"
    return "\n".join([*lines, "", f"2P1D over colocated, per GPU: {gain}"])
