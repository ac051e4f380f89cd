"""`prefill loadtest`: a client that measures any OpenAI-compatible server (TTFT, ITL, TPOT, E2E, goodput)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefill.cli.common import console, note

Url = Annotated[str, typer.Option(help="server root (without /v1)")]
ModelId = Annotated[str | None, typer.Option(help="model id (default: the first of GET /v1/models)")]
Chat = Annotated[bool, typer.Option(help="use /v1/chat/completions instead of /v1/completions")]
Concurrency = Annotated[int, typer.Option(help="clients in flight (fixed-concurrency mode, or the cap with --rate)")]
Rate = Annotated[float | None, typer.Option(help="Poisson arrival rate in requests/s (default: fixed concurrency)")]
Duration = Annotated[float, typer.Option(help="stop after this many seconds")]
Requests = Annotated[int, typer.Option(help="stop after this many requests")]
PromptLen = Annotated[str, typer.Option(help="prompt tokens: 128, 64:512 (uniform) or @file (one per line)")]
PromptsFile = Annotated[str | None, typer.Option(help="real prompts, one per line (overrides --prompt-len)")]
SystemPromptFile = Annotated[str | None, typer.Option(help="a system prompt shared by every request (prefix caching)")]
MaxTokens = Annotated[int, typer.Option(help="output tokens asked per request")]
Temperature = Annotated[float, typer.Option(help="sampling temperature")]
SloTtftMs = Annotated[float | None, typer.Option(help="goodput SLO on TTFT, ms")]
SloTpotMs = Annotated[float | None, typer.Option(help="goodput SLO on TPOT, ms")]
NoUsage = Annotated[bool, typer.Option(help="do not ask for stream_options.include_usage")]
TokenizerOpt = Annotated[
    str | None,
    typer.Option(
        help="a .gguf file or model folder whose tokenizer counts each request's tokens where the server streams "
        "no usage (llama-cpp-python's server), so --predict and plan --fit can run on it"
    ),
]
IgnoreEos = Annotated[bool, typer.Option(help="ask for exactly --max-tokens (ignore_eos, as vLLM's benchmarks do)")]
Seed = Annotated[int, typer.Option(help="seed of prompt lengths and words")]
Predict = Annotated[bool, typer.Option(help="also simulate the same trace on the time model (prefill simulate)")]
PredictModel = Annotated[str | None, typer.Option(help="the served model for --predict (default: SmolLM2)")]
PredictHardware = Annotated[
    str,
    typer.Option(
        help="for --predict: cpu (this machine, probed), or the GPUs the server runs on: h100, or 2xh100 for one "
        "model split over two (tensor parallelism)"
    ),
]
PredictEngine = Annotated[
    str | None,
    typer.Option(
        help="for --predict on a GPU: the server's engine, vllm, sglang, trtllm or prefill (vllm:fp8 for FP8)"
    ),
]
Out = Annotated[str, typer.Option(help="JSON report (config, summary, every request)")]
ApiKey = Annotated[
    str | None, typer.Option(envvar="PREFILL_API_KEY", help="sent as Authorization: Bearer KEY (not in the report)")
]
Plot = Annotated[str | None, typer.Option(help="PNG plot (default: --out with .png)")]


def loadtest(
    url: Url = "http://127.0.0.1:8000",
    model: ModelId = None,
    chat: Chat = False,
    concurrency: Concurrency = 4,
    rate: Rate = None,
    duration: Duration = 60.0,
    requests: Requests = 100,
    prompt_len: PromptLen = "128",
    prompts_file: PromptsFile = None,
    system_prompt_file: SystemPromptFile = None,
    max_tokens: MaxTokens = 64,
    temperature: Temperature = 0.0,
    slo_ttft_ms: SloTtftMs = None,
    slo_tpot_ms: SloTpotMs = None,
    no_usage: NoUsage = False,
    tokenizer: TokenizerOpt = None,
    ignore_eos: IgnoreEos = False,
    seed: Seed = 0,
    out: Out = "loadtest.json",
    plot: Plot = None,
    predict: Predict = False,
    predict_model: PredictModel = None,
    hardware: PredictHardware = "cpu",
    engine: PredictEngine = None,
    api_key: ApiKey = None,
) -> None:
    """Load-test any OpenAI-compatible server: TTFT, ITL, TPOT, E2E percentiles, throughput, goodput."""
    from prefill.loadtest.client import LoadTestConfig

    load = {"concurrency": concurrency, "rate": rate, "duration_s": duration, "max_requests": requests}
    ask = {"max_tokens": max_tokens, "temperature": temperature, "seed": seed, "ignore_eos": ignore_eos}
    prompts = prompt_fields(prompt_len, prompts_file, system_prompt_file)
    usage = {"include_usage": not no_usage, "tokenizer": tokenizer}
    cfg = LoadTestConfig(url.rstrip("/"), model=model, chat=chat, api_key=api_key, **usage, **load, **ask, **prompts)
    console.print(f"load test of {cfg.url}: {mode_text(cfg)}, {prompts_text(cfg)}", highlight=False)
    finish = prepare_prediction(predict, predict_model, cfg, hardware, engine)
    records, summary, model_id = measure(cfg, slo_ttft_ms, slo_tpot_ms)
    save(cfg, model_id, summary, records, out, plot or str(Path(out).with_suffix(".png")))
    finish(records, summary, Path(out))


def measure(cfg, slo_ttft_ms: float | None, slo_tpot_ms: float | None) -> tuple:
    """Run the load test and print its summary: (records, summary, the server's model id)."""
    records, wall, model_id = run(cfg)
    summary = summarize(records, wall, seconds(slo_ttft_ms), seconds(slo_tpot_ms))
    print_summary(model_id, summary, wall, slo_ttft_ms, slo_tpot_ms)
    return records, summary, model_id


def run(cfg) -> tuple:
    """The load test itself: (records, wall seconds, the server's model id)."""
    import asyncio

    from prefill.loadtest.client import run_load_test

    return asyncio.run(run_load_test(cfg))


def prepare_prediction(predict: bool, model: str | None, cfg, hardware: str, engine: str | None):
    """--predict: on this CPU, its measurements before the load; on a GPU, the deployment. Returns what to call
    after the load with (records, summary, report path): nothing without --predict."""
    if not predict:
        return lambda records, summary, out: None
    if hardware.lower() == "cpu":
        prediction = start_prediction(model, cfg)
        return lambda records, summary, out: finish_prediction(prediction, records, summary, cfg.concurrency, out)
    server = gpu_server(model, hardware, engine)
    return lambda records, summary, out: predict_gpu(server, records, summary, cfg.concurrency, out)


def gpu_server(model: str | None, hardware: str, engine: str | None):
    """--predict --hardware [Nx]GPU --engine E[:WEIGHTS]: the deployment the measured server is."""
    from prefill.costmodel.specs import load_spec
    from prefill.errors import BadInput
    from prefill.plan.gpu_serving import GpuServer

    if engine is None or model is None:
        raise BadInput("--predict on a GPU needs --engine (vllm, sglang, ...) and --predict-model (e.g. llama-3.1-8b)")
    count, _, gpu = hardware.lower().rpartition("x") if "x" in hardware.lower()[:3] else ("1", "", hardware)
    if not count.isdigit():
        raise BadInput(f"--hardware wants a GPU or NxGPU (2xh100), got {hardware!r}")
    name, _, weights = engine.partition(":")
    return GpuServer.of(load_spec(model), gpu, name, weights or "bfloat16", None, int(count))


def predict_gpu(server, records: list, summary: dict, in_flight: int, out: Path) -> None:
    """The measured trace on the simulated GPU deployment, beside the measurement, and into the JSON report."""
    import json

    from prefill.plan.engine_fit import predict_load

    predicted = predict_load(server, records, in_flight)
    console.print(f"predicted: {server.name}; {server.profile.source}", highlight=False)
    print_prediction(summary, predicted)
    report = json.loads(out.read_text())
    report["predicted"] = {"summary": predicted, "server": server.name, "profile": server.profile.to_json()}
    out.write_text(json.dumps(report, indent=2, default=str))


def start_prediction(model: str | None, cfg):
    """--predict's measurements before the load (prefill.plan.load_prediction)."""
    from prefill.plan.load_prediction import LoadPrediction

    return LoadPrediction.start(model, cfg, note)


def finish_prediction(prediction, records: list, summary: dict, in_flight: int, out: Path) -> None:
    """--predict after the load: the simulated trace, each percentile beside the measured one, the JSON report."""
    predicted = prediction.finish(records, in_flight, note)
    console.print(prediction.describe(), highlight=False)
    print_prediction(summary, predicted)
    prediction.save(out)


def summarize(records: list, wall: float, slo_ttft_s: float | None = None, slo_tpot_s: float | None = None) -> dict:
    from prefill.loadtest import report as loadtest_report

    return loadtest_report.summarize(records, wall, slo_ttft_s, slo_tpot_s)


def print_prediction(measured: dict, predicted: dict) -> None:
    """Each percentile measured beside predicted, with the prediction's error."""
    from rich.table import Table

    table = Table(title="measured vs predicted (prefill simulate on the same trace)")
    for col in ("metric (ms)", "p50 meas.", "p50 pred.", "err", "p99 meas.", "p99 pred.", "err"):
        table.add_column(col, justify="right")
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("E2E", "e2e_s")):
        m, p = measured["latency"][key], predicted["latency"][key]
        if not (m and p):
            continue
        cells = []
        for q in ("p50", "p99"):
            cells += [f"{m[q] * 1e3:.1f}", f"{p[q] * 1e3:.1f}", f"{p[q] / m[q] - 1:+.0%}" if m[q] > 0 else "-"]
        table.add_row(name, *cells)
    console.print(table)


def prompt_fields(prompt_len: str, prompts_file: str | None, system_prompt_file: str | None) -> dict:
    """The LoadTestConfig fields of the prompts: their lengths, the real prompts (the non-empty lines of
    `prompts_file`) and the system prompt."""
    from prefill.loadtest.client import PromptLengths

    prompts = Path(prompts_file).read_text().splitlines() if prompts_file else []
    system = Path(system_prompt_file).read_text() if system_prompt_file else None
    lines = tuple(line for line in prompts if line.strip())
    return {"prompt_lengths": PromptLengths.parse(prompt_len), "prompts": lines, "system_prompt": system}


def prompts_text(cfg) -> str:
    """'prompts 128 tokens, max_tokens 64'."""
    lengths = "from file" if cfg.prompts else cfg.prompt_lengths.describe()
    return f"prompts {lengths} tokens, max_tokens {cfg.max_tokens}"


def seconds(ms: float | None) -> float | None:
    """Milliseconds in seconds; None stays None (no SLO)."""
    return ms / 1e3 if ms is not None else None


def mode_text(cfg) -> str:
    """'Poisson 2.0 req/s (cap 4)' or 'concurrency 4'."""
    return f"Poisson {cfg.rate} req/s (cap {cfg.concurrency})" if cfg.rate else f"concurrency {cfg.concurrency}"


def print_summary(model_id: str, summary: dict, wall: float, slo_ttft_ms: float | None, slo_tpot_ms: float | None):
    """The latency percentiles as a table, then throughput, goodput, errors and the definitions."""
    from rich.table import Table

    from prefill.loadtest.report import DEFINITIONS

    table = Table(title=f"{model_id}: {summary['successful']}/{summary['requests']} requests ok in {wall:.1f} s")
    for col in ("metric (ms)", "mean", "p50", "p90", "p99", "n"):
        table.add_column(col, justify="right")
    for name, key in (("TTFT", "ttft_s"), ("ITL", "itl_s"), ("TPOT", "tpot_s"), ("E2E", "e2e_s")):
        st = summary["latency"][key]
        cells = [f"{st[k] * 1e3:.1f}" for k in ("mean", "p50", "p90", "p99")] + [str(st["n"])] if st else ["-"] * 5
        table.add_row(name, *cells)
    console.print(table)
    console.print(
        f"throughput {summary['throughput_req_per_s']:.2f} req/s, {summary['throughput_output_tok_per_s']:.1f} "
        f"output tok/s; goodput {summary['goodput_req_per_s']:.2f} req/s "
        f"({slo_text(slo_ttft_ms, slo_tpot_ms)}; {summary['slo_attainment']:.0%} of requests)",
        highlight=False,
    )
    for err, n in summary["errors"].items():
        console.print(f"[red]{n} x {err}[/]", highlight=False)
    console.print("definitions: " + "; ".join(f"{k}: {v}" for k, v in DEFINITIONS.items()), highlight=False)


def slo_text(ttft_ms: float | None, tpot_ms: float | None) -> str:
    """'SLO TTFT <= 500 ms, TPOT <= 50 ms', the part given, or 'no SLO: every successful request counts'."""
    parts = [f"{name} <= {v:g} ms" for name, v in (("TTFT", ttft_ms), ("TPOT", tpot_ms)) if v is not None]
    return "SLO " + ", ".join(parts) if parts else "no SLO: every successful request counts"


def save(cfg, model_id: str, summary: dict, records: list, out: str, plot: str) -> None:
    """The JSON report (config, summary, every request) and the plot."""
    import dataclasses

    from prefill.loadtest import report

    config = {**dataclasses.asdict(cfg), "model": model_id, "prompts": len(cfg.prompts), "api_key": bool(cfg.api_key)}
    report.write_json(Path(out), config, summary, records)
    report.plot(Path(plot), records, f"{model_id} at {cfg.url}: {mode_text(cfg)}")
    console.print(f"wrote {out} and {plot}", highlight=False)
