"""Serving: `prefill serve` (the OpenAI server) and `prefill lab` (the server with the lesson page)."""

from __future__ import annotations

from typing import Annotated

import typer

from prefill.cli.common import (
    KV_STORE_MB,
    Activations,
    AutoDtype,
    KVDtype,
    KVStoreDir,
    KVStoreMb,
    Weights,
    WorkloadOpt,
    console,
    fail,
    load_engine,
)
from prefill.cli.serve_access import AllowedHosts, ApiKey, ApiKeyFile, api_key_of, hosts_of, warn_if_exposed

MaxRunning = Annotated[int, typer.Option(help="requests running at once (their decode steps share one batch)")]
Deterministic = Annotated[
    bool, typer.Option("--deterministic", help="batch-invariant: a request's logits do not depend on the load")
]
ServeModel = Annotated[str | None, typer.Option(help="a .gguf file or Hugging Face folder (default: embedded SmolLM2)")]
Host = Annotated[str, typer.Option(help="address to bind (loopback by default)")]
Port = Annotated[int, typer.Option(help="TCP port")]
KV_CACHE_HELP = "the KV pool shared by all requests, in MiB (default: a quarter of free memory, at most 2 GiB)"
PREFIX_CACHE_HELP = "prefix cache's share of the KV pool in MiB (0 disables it)"


def serve(
    model: ServeModel = None,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    dtype: AutoDtype = "auto",
    weights: Weights = "auto",
    device: Annotated[str, typer.Option(help="cpu or cuda")] = "cpu",
    kv_cache_mb: Annotated[float | None, typer.Option(help=KV_CACHE_HELP)] = None,
    prefix_cache_mb: Annotated[float, typer.Option(help=PREFIX_CACHE_HELP)] = 256.0,
    max_queue: Annotated[int, typer.Option(help="requests that may wait beyond --max-running; more get HTTP 429")] = 64,
    max_running: MaxRunning = 32,
    chunk_size: Annotated[int, typer.Option(help="prefill chunk in tokens, interleaved with decode steps")] = 256,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = None,
    deterministic: Deterministic = False,
    kv_store: KVStoreDir = None,
    kv_store_mb: KVStoreMb = KV_STORE_MB,
    workload: WorkloadOpt = None,
    kv_dtype: KVDtype = "auto",
    activations: Activations = "auto",
    api_key: ApiKey = None,
    api_key_file: ApiKeyFile = None,
    allowed_hosts: AllowedHosts = None,
) -> None:
    """OpenAI-compatible server: /v1/completions, /v1/chat/completions, /v1/models, /health, /metrics."""
    from prefill.cli.common import attach_store, check_store_size, open_engine
    from prefill.server.app import ServeConfig, model_id_of
    from prefill.server.config import SERVE_PROBE_MAX_AGE_S

    check_store_size(kv_store, kv_store_mb, kv_cache_mb)
    access = access_of(host, api_key, api_key_file, allowed_hosts)
    engine, _, _ = open_engine(model, dtype, weights, device, threads, deterministic, workload, kv_dtype, activations)
    if kv_store is not None:
        attach_store(engine, kv_store, kv_store_mb)
    sizes = {"prefix_cache_mb": prefix_cache_mb, "kv_cache_mb": kv_cache_mb, "chunk_size": chunk_size}
    limits = {"max_queue": max_queue, "max_running": max_running, "probe_max_age_s": SERVE_PROBE_MAX_AGE_S}
    limits["exact_scoring"] = activations == "auto"  # scoring: float32 activations unless --activations named one
    config = ServeConfig(model_id_of(engine), populate_kv=True, **limits, **sizes, **access)
    code = serve_engine(engine, config, host, port)
    if code:
        fail("the server stopped because its scheduler could not serve (see the log above)", code)


def access_of(host: str, api_key: str | None, api_key_file: str | None, allowed_hosts: str | None) -> dict:
    """ServeConfig's api_key and allowed_hosts from the options, after the warning when the server is exposed."""
    key, hosts = api_key_of(api_key, api_key_file), hosts_of(allowed_hosts, host)
    warn_if_exposed(host, key, hosts)
    return {"api_key": key, "allowed_hosts": hosts}


def serve_engine(engine, config, host: str, port: int) -> int:
    """Serve `engine` with `config` at host:port until SIGTERM / SIGINT, after saying how large its KV pool is
    and where it answers; the exit status (non-zero when the scheduler could not serve)."""
    from prefill.lesson.routes import add_lesson
    from prefill.server.app import create_app
    from prefill.server.server import run_server

    app = add_lesson(create_app(engine, config))  # the lesson page at /, as `prefill lab` serves it
    pool = app.state.server.worker.loop.pool
    tokens = pool.max_tokens()
    mib = pool.allocated_bytes() / 1024**2
    console.print(
        f"KV pool: {mib:,.0f} MiB = {pool.n_blocks:,} blocks of {pool.block_size} tokens ({tokens:,} tokens)",
        highlight=False,
    )
    where = f"({engine.path_label}) at http://{host}:{port}/v1"
    console.print(f"serving [bold]{config.model_id}[/] {where}", highlight=False)
    return run_server(app, host, port)


def lab(
    model: ServeModel = None,
    host: Host = "127.0.0.1",
    port: Port = 8000,
    open_browser: Annotated[bool, typer.Option("--open/--no-open", help="open the page in a browser")] = True,
    activations: Activations = "auto",
    api_key: ApiKey = None,
    api_key_file: ApiKeyFile = None,
    allowed_hosts: AllowedHosts = None,
) -> None:
    """`prefill serve` plus the lesson page opened in a browser (the URL is printed when none can be opened)."""
    from prefill.lesson.lab import open_when_up
    from prefill.lesson.routes import add_lesson
    from prefill.server.app import ServeConfig, create_app, model_id_of
    from prefill.server.config import SERVE_PROBE_MAX_AGE_S
    from prefill.server.server import run_server

    access = access_of(host, api_key, api_key_file, allowed_hosts)
    engine = load_engine(model, "float32", None, activations=activations)  # warmed up: the timeline's steady state
    # the key travels in the URL's fragment, which the browser never sends; the page keeps it in sessionStorage
    url = f"http://{host}:{port}/" + (f"#key={access['api_key']}" if access["api_key"] else "")
    console.print(
        f"the prefill lesson, live on [bold]{model_id_of(engine)}[/] ({engine.path_label}): {url}", highlight=False
    )
    if open_browser:
        open_when_up(url, lambda ok: None if ok else console.print(f"no browser could be opened: visit {url}"))
    exact = activations == "auto"  # scoring runs float32 activations unless --activations named the path
    config = ServeConfig(model_id_of(engine), probe_max_age_s=SERVE_PROBE_MAX_AGE_S, exact_scoring=exact, **access)
    run_server(add_lesson(create_app(engine, config)), host, port)
