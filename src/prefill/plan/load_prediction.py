"""`prefill loadtest --predict`: the load test's own trace through `prefill serve`'s scheduling on a simulated
clock (prefill.plan.simulate), timed by the time model on this machine as it was while the load ran.

    before = LoadPrediction.start(model, cfg, echo)   # a probe, and requests timed on the server
    ... the load test ...
    predicted = before.finish(records, in_flight=cfg.concurrency, echo)  # a second probe, the simulation
    predicted.save(Path("loadtest.json"))             # the prediction beside the measurement in the report

Three measurements feed it, none of the load itself: the machine probed before and after the load (its speed
drifts over minutes on a shared host: a probe of other minutes predicts another machine), the step loop's own
work per step (loop_overhead), and the server's own time beyond both (HTTP, SSE, its event loop, its prefill
against the time model's), timed on a few requests sent to it before the load (server_calibration).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefill.errors import BadInput
from prefill.loadtest.client import LoadTestConfig, PromptLengths, RequestRecord
from prefill.loadtest.report import summarize
from prefill.loadtest.server_calibration import ALONE, BURST, PROBES, Timed, timed_requests
from prefill.plan.simulate import ServerModel, server_model, simulate, trace_of

CHUNK, MAX_RUNNING = 256, 32  # `prefill serve`'s scheduling defaults
PROBE_PROMPTS = PromptLengths(64, 192)  # the prompts prefilled while a burst decodes, where the load's are not known
DEFAULT_KV_MB = 2048.0  # `prefill serve`'s KV pool where the server does not say (its default's cap)


def served_as(model: str | None, url: str) -> dict:
    """How the server at `url` runs, as server_model takes it: {"dtype", "weights", "kv_mb" (its KV pool's MiB),
    "activations" (the blocks' "f32" / "q8"), "kv_dtype"} from its /health (`prefill serve` reports them; the
    last two None where a server does not say them: the engine's defaults), else what `prefill serve` would run
    here by default (K/V in the compute dtype)."""
    import httpx

    try:
        health = httpx.get(f"{url}/health", timeout=10.0).json()
        said = {"dtype": health["dtype"], "weights": health["weights"], "kv_mb": health["kv_pool_bytes"] / 2**20}
        return said | {"activations": health.get("activations"), "kv_dtype": health.get("kv_dtype")}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        from prefill.engine.weights import resolve_path

        dtype, weights, activations = resolve_path(model, "auto", "auto", echo=None)
        said = {"dtype": dtype, "weights": weights, "kv_mb": DEFAULT_KV_MB}
        return said | {"activations": activations, "kv_dtype": None}


def server_of(served: dict, echo: Callable[[str], None] | None = None) -> ServerModel:
    """server_model on this CPU of `served` ({"model"} and served_as's keys; a report saved before activations
    and kv_dtype were recorded: the engine's defaults)."""
    model, dtype, weights, kv_mb = served["model"], served["dtype"], served["weights"], served["kv_mb"]
    how = {"activations": served.get("activations"), "kv_dtype": served.get("kv_dtype")}
    return server_model(model, "cpu", dtype, weights, kv_mb, echo=echo, **how)


def probe_lengths(cfg: LoadTestConfig) -> PromptLengths:
    """Tokens of the prompts timed while a burst decodes: the load's lengths, at most a chunk (PROBE_PROMPTS where
    the load sends real prompts)."""
    if cfg.prompts or cfg.system_prompt:
        return PROBE_PROMPTS
    lengths = cfg.prompt_lengths
    capped = tuple(min(CHUNK, n) for n in lengths.choices)
    return PromptLengths(min(CHUNK, lengths.lo), min(CHUNK, lengths.hi), capped)


def simulate_load(server: ServerModel, records: list[RequestRecord], in_flight: int | None):
    """The load's trace through `server` with `prefill serve`'s scheduling defaults (chunk 256, 32 running) and
    the server's own time, the client holding at most `in_flight` requests at it; the SimResult."""
    trace, steps, own = trace_of(records), server.steps(), server.serving
    late = {"in_flight": in_flight, "latency_s": own.latency_s, "intake_s": own.intake_s}
    return simulate(server.spec, trace, steps, server.tokens, CHUNK, MAX_RUNNING, **late)


@dataclass
class LoadPrediction:
    server: ServerModel
    probe: dict  # the probe before the load
    timed: list[Timed]  # requests timed on the server before the load, and after it (timed_requests)
    cfg: LoadTestConfig  # the load's
    summary: dict | None = None  # the simulated load, once finished
    served: dict | None = None  # the model and served_as's: how the prediction took the server to run

    @classmethod
    def start(cls, model: str | None, cfg: LoadTestConfig, echo: Callable[[str], None]) -> LoadPrediction:
        """The server at cfg.url as its /health says it runs (dtype, weights, KV pool; another kind of server:
        `prefill serve`'s defaults on this CPU), a probe of this machine now, and requests timed on the server
        (server_calibration.timed_requests; its probe prompts of the load's lengths)."""
        served = {"model": model, **served_as(model, cfg.url)}
        server = server_of(served, echo)
        echo("probing this machine before the load (and again after it), and timing requests on the server, to predict")
        probe = server.probe()
        return cls(server, probe, [timed_requests(cfg, probe_lengths(cfg))], cfg, served=served)

    def finish(self, records: list[RequestRecord], in_flight: int, echo: Callable[[str], None]) -> dict:
        """Requests timed on the server again and a second probe, then the load's trace simulated with `prefill
        serve`'s scheduling defaults (chunk 256, 32 running), the client holding at most `in_flight` requests at
        the server as the load test did; its summary."""
        if not trace_of(records):
            why = (
                "the server reported no token counts (stream_options.include_usage): --predict has no trace to run; "
                "--tokenizer MODEL counts them here"
            )
            raise BadInput(why)
        self.timed.append(timed_requests(self.cfg, probe_lengths(self.cfg)))
        server = self.server.with_probes([self.probe, self.server.probe()])
        try:
            server = server.with_serving(self.timed)
        except ValueError as e:
            echo(f"{e}: the prediction leaves the server's own time out")
        result = simulate_load(server, records, in_flight)
        self.server, self.summary = server, summarize(result.records, result.wall_s)
        return self.summary

    def describe(self) -> str:
        s, own = self.server, self.server.serving
        a, b = (1e3 * x for x in s.loop_s)
        c, e, h, i = (1e3 * x for x in (own.c, own.e, own.latency_s, own.intake_s))
        return (
            f"predicted: {s.name}; {s.profile.source}. Beside each forward: the step loop's own work {a:.2f} ms + "
            f"{b:.2f} ms a row, the server's {c:.2f} ms + {e:.2f} ms a row after the first; steps that prefill at "
            f"{own.prefill_scale:.2f}x the time model; {i:.1f} ms more for a step a request arrived in; {h:.1f} ms "
            "a request outside the server's clock (timed on "
            f"{ALONE} requests alone, {BURST} together and {PROBES} prefilled while they decoded, before the load "
            "and after it)"
        )

    def save(self, out: Path) -> None:
        """The prediction beside the measurement in the load test's JSON report: its summary and its inputs."""
        report = json.loads(out.read_text())
        report["predicted"] = {
            "summary": self.summary,
            "server": self.server.name,
            "profile": self.server.profile.source,
            "machine_profile": self.server.profile.to_json(),  # the numbers the prediction read, to reproduce it
            "loop_s": list(self.server.loop_s),  # the step loop's own seconds per step: a + b R
            "serving": dataclasses.asdict(self.server.serving),  # the server's own time, timed on it
            "served": self.served,  # what server_model was given (prefill.plan.cpu_fit rebuilds it)
            "timed_on_server": [[dataclasses.asdict(r) for r in a + b] for a, b in self.timed],  # before, after
        }
        out.write_text(json.dumps(report, indent=2, default=str))
