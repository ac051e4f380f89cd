"""Prometheus metrics of the server, on a private registry (so two servers in one process never clash).

Latencies in seconds, sizes in tokens or bytes. Scraped at GET /metrics.
"""

from __future__ import annotations

from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")  # the POSTs counted in prefill_received_requests

# Buckets: CPU prefill of a small model spans milliseconds to tens of seconds.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServerMetrics:
    """Every metric the server exports."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        latency = partial(Histogram, buckets=_LATENCY, registry=r)
        tokens = partial(Histogram, buckets=_TOKENS, registry=r)
        counter, gauge = partial(Counter, registry=r), partial(Gauge, registry=r)
        self.ttft = latency("prefill_ttft_seconds", "Request arrival to first token ready")
        self.queue = latency("prefill_queue_seconds", "Time waiting for the scheduler")
        self.prefill = latency("prefill_prefill_seconds", "Compute seconds of a request's prefill forwards")
        self.itl = latency("prefill_inter_token_latency_seconds", "Gap between consecutive generated tokens")
        self.prompt_tokens = tokens("prefill_prompt_tokens", "Prompt tokens per request")
        self.generated_tokens = tokens("prefill_generated_tokens", "Generated tokens per request")
        self.requests = counter(
            "prefill_requests", "Requests finished, by endpoint and finish reason", ["endpoint", "finish_reason"]
        )
        self.errors = counter(
            "prefill_errors",
            "Requests refused or failed, by route (its path template; `other`: unknown paths and methods) and HTTP "
            "status",
            ["route", "status"],
        )
        self.received = counter(
            "prefill_received_requests",
            "POSTs to /v1/completions and /v1/chat/completions; received = requests + errors{route=those two} + "
            "cancelled",
        )
        self.cancelled = counter(
            "prefill_cancelled",
            "Requests dropped before their end: the client disconnected or did not read its stream",
            ["reason"],
        )
        self.cached_tokens = counter("prefill_cached_prompt_tokens", "Prompt tokens served from the prefix cache")
        self.kv_store_hits = counter("prefill_kv_store_hits", "Requests that loaded a prefix from the KV store")
        self.kv_store_bytes_loaded = counter("prefill_kv_store_bytes_loaded", "Bytes of block files loaded")
        self.kv_store_seconds_saved = counter(
            "prefill_kv_store_seconds_saved_predicted",
            "Prefill seconds the KV store's loads saved, as the cost model predicted them (compute - load)",
        )
        self.kv_store_bad_blocks = counter(
            "prefill_kv_store_bad_blocks", "Stored blocks rejected (checksum, fingerprint, version, truncation)"
        )
        self.scored_tokens = counter(
            "prefill_scored_prompt_tokens",
            "Prompt tokens scored with every position's log-probability (echo with logprobs)",
        )
        self.queued = gauge("prefill_queued_requests", "Requests waiting for the scheduler")
        self.running = gauge("prefill_running_requests", "Requests being prefilled or decoded")
        self.kv_bytes = gauge("prefill_kv_cache_bytes", "K/V bytes the running requests hold (filled positions)")
        self.kv_used_bytes = gauge(
            "prefill_kv_pool_used_bytes",
            "Bytes of KV-pool blocks in use (requests and prefix cache; shared blocks once)",
        )
        self.kv_pool_bytes = gauge("prefill_kv_pool_bytes", "Bytes of the whole KV pool (--kv-cache-mb)")
        self.prefix_bytes = gauge("prefill_prefix_cache_bytes", "Bytes held by the prefix cache")
        self.preemptions = gauge(
            "prefill_preemptions",
            "Running requests preempted since the start (blocks taken back, prefill recomputed later)",
        )

    def error(self, scope: dict, status: int) -> None:
        """Count one refusal or failure of the request in ASGI `scope` under its route."""
        self.errors.labels(route=route_of(scope), status=str(status)).inc()

    def refused_unread(self, scope: dict, status: int) -> None:
        """Count a request refused before its body was read (an unknown Host, a missing API key): a generation POST
        is received and refused, so that the generation routes' counts still balance."""
        if is_generation(scope):
            self.received.inc()
        self.error(scope, status)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


def is_generation(scope: dict) -> bool:
    """A generation POST (counted in prefill_received_requests)."""
    return scope["method"] == "POST" and scope["path"] in GENERATION_PATHS


def route_of(scope: dict) -> str:
    """The `route` label of a request: the path template of the route that took it ("/v1/models/{model}"), the path
    of a generation POST refused before routing (a body over the limit), or "other" (an unknown path, a method the
    route does not take), so that a generation route's errors are exactly the errors of its received requests."""
    route, method = scope.get("route"), scope.get("method")
    if route is not None and method in (getattr(route, "methods", None) or {method}):
        return route.path
    if method == "POST" and scope.get("path") in GENERATION_PATHS:
        return scope["path"]
    return "other"
