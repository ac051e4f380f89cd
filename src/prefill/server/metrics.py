"""Prometheus metrics of the server, on a private registry (so two servers in one process never clash).

Latencies in seconds, sizes in tokens or bytes. Scraped at GET /metrics.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Buckets: CPU prefill of a small model spans milliseconds to tens of seconds.
_LATENCY = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)


class ServerMetrics:
    """Every metric the server exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.ttft = Histogram(
            "prefill_ttft_seconds", "Request arrival to first token ready", buckets=_LATENCY, registry=r
        )
        self.queue = Histogram("prefill_queue_seconds", "Time waiting for the scheduler", buckets=_LATENCY, registry=r)
        self.prefill = Histogram(
            "prefill_prefill_seconds", "Compute seconds of a request's prefill forwards", buckets=_LATENCY, registry=r
        )
        self.itl = Histogram(
            "prefill_inter_token_latency_seconds",
            "Gap between consecutive generated tokens",
            buckets=_LATENCY,
            registry=r,
        )
        self.prompt_tokens = Histogram(
            "prefill_prompt_tokens", "Prompt tokens per request", buckets=_TOKENS, registry=r
        )
        self.generated_tokens = Histogram(
            "prefill_generated_tokens", "Generated tokens per request", buckets=_TOKENS, registry=r
        )
        self.requests = Counter(
            "prefill_requests",
            "Requests finished, by endpoint and finish reason",
            ["endpoint", "finish_reason"],
            registry=r,
        )
        self.errors = Counter("prefill_errors", "Requests refused or failed, by HTTP status", ["status"], registry=r)
        self.received = Counter(
            "prefill_received_requests",
            "POSTs to /v1/completions and /v1/chat/completions; received = requests + errors + cancelled",
            registry=r,
        )
        self.cancelled = Counter(
            "prefill_cancelled",
            "Requests dropped before their end: the client disconnected or did not read its stream",
            ["reason"],
            registry=r,
        )
        self.cached_tokens = Counter(
            "prefill_cached_prompt_tokens", "Prompt tokens served from the prefix cache", registry=r
        )
        self.scored_tokens = Counter(
            "prefill_scored_prompt_tokens",
            "Prompt tokens scored with every position's log-probability (echo with logprobs)",
            registry=r,
        )
        self.queued = Gauge("prefill_queued_requests", "Requests waiting for the scheduler", registry=r)
        self.running = Gauge("prefill_running_requests", "Requests being prefilled or decoded", registry=r)
        self.kv_bytes = Gauge(
            "prefill_kv_cache_bytes", "K/V bytes the running requests hold (filled positions)", registry=r
        )
        self.kv_used_bytes = Gauge(
            "prefill_kv_pool_used_bytes",
            "Bytes of KV-pool blocks in use (requests and prefix cache; shared blocks once)",
            registry=r,
        )
        self.kv_pool_bytes = Gauge("prefill_kv_pool_bytes", "Bytes of the whole KV pool (--kv-cache-mb)", registry=r)
        self.prefix_bytes = Gauge("prefill_prefix_cache_bytes", "Bytes held by the prefix cache", registry=r)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
