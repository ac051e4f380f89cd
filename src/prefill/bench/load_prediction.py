"""`prefill loadtest --predict`: the load test's own trace through `prefill serve`'s scheduling on a simulated
clock (prefill.bench.simulate), timed by the time model on this machine as it was while the load ran.

    before = LoadPrediction.start(model, cfg, echo)   # a probe, and one request the server runs alone
    ... the load test ...
    predicted = before.finish(records, in_flight=cfg.concurrency, echo)  # a second probe, the simulation
    predicted.save(Path("loadtest.json"))             # the prediction beside the measurement in the report

Three measurements feed it, none of the load itself: the machine probed before and after the load (its speed
drifts over minutes on a shared host: a probe of other minutes predicts another machine), the step loop's own
work per step (loop_overhead), and the server's own time per step beyond both, from the gaps between the tokens
of one request it ran alone before the load (HTTP, SSE, its event loop).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from prefill.bench import loadtest
from prefill.bench.loadtest import LoadTestConfig, PromptLengths, RequestRecord
from prefill.bench.loadtest_report import summarize
from prefill.bench.simulate import ServerModel, server_model, simulate, trace_of

ALONE_PROMPT, ALONE_TOKENS = 32, 33  # the request timed alone: 32 gaps between its tokens
DEFAULT_KV_MB = 2048.0  # `prefill serve`'s KV pool where the server does not say (its default's cap)


def served_as(model: str | None, url: str) -> tuple[str, str, float]:
    """(dtype, weights, KV pool MiB) of the server at `url` from its /health (`prefill serve` reports them), else
    what `prefill serve` would run here by default."""
    import httpx

    try:
        health = httpx.get(f"{url}/health", timeout=10.0).json()
        return health["dtype"], health["weights"], health["kv_pool_bytes"] / 2**20
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        from prefill.engine.weights import resolve_storage

        return (*resolve_storage(model, "auto", "auto", echo=None), DEFAULT_KV_MB)


@dataclass
class LoadPrediction:
    server: ServerModel
    probe: dict  # the probe before the load
    alone: RequestRecord  # the request the server ran alone before the load
    summary: dict | None = None  # the simulated load, once finished

    @classmethod
    def start(cls, model: str | None, cfg: LoadTestConfig, echo: Callable[[str], None]) -> LoadPrediction:
        """The server at cfg.url as its /health says it runs (dtype, weights, KV pool; another kind of server:
        `prefill serve`'s defaults on this CPU), a probe of this machine now, and one request sent alone to it
        (words no request of the load begins with, so the load meets no prefix of it in the server's cache)."""
        dtype, weights, kv_mb = served_as(model, cfg.url)
        server = server_model(model, "cpu", dtype, weights, kv_mb, echo=echo)
        echo("probing this machine before the load (and again after it), and timing one request alone, to predict")
        probe = server.probe()
        one = {"concurrency": 1, "rate": None, "max_requests": 1, "prompts": (), "seed": -1 - cfg.seed}
        lengths = PromptLengths(ALONE_PROMPT, ALONE_PROMPT)
        alone = dataclasses.replace(cfg, prompt_lengths=lengths, max_tokens=ALONE_TOKENS, ignore_eos=True, **one)
        return cls(server, probe, asyncio.run(loadtest.run_load_test(alone))[0][0])

    def finish(self, records: list[RequestRecord], in_flight: int, echo: Callable[[str], None]) -> dict:
        """The load's trace simulated with `prefill serve`'s scheduling defaults (chunk 256, 32 running), the
        client holding at most `in_flight` requests at the server as the load test did; its summary."""
        server = self.server.with_probes([self.probe, self.server.probe()])
        try:
            server = server.with_serving(self.alone)
        except ValueError as e:
            echo(f"{e}: the prediction leaves the server's own time per step out")
        result = simulate(server.spec, trace_of(records), server.steps(), server.tokens, 256, 32, in_flight=in_flight)
        self.server, self.summary = server, summarize(result.records, result.wall_s)
        return self.summary

    def describe(self) -> str:
        a, b = (1e3 * s for s in self.server.loop_s)
        return (
            f"predicted: {self.server.name}; {self.server.profile.source}. Beside each forward: the step loop's own "
            f"work {a:.2f} ms + {b:.2f} ms a row, the server's {self.server.serving_s * 1e3:.2f} ms (timed on one "
            "request alone before the load)"
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
            "serving_s": self.server.serving_s,
        }
        out.write_text(json.dumps(report, indent=2, default=str))
