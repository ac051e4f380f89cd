"""One server's configuration (`ServeConfig`: sizes and limits, built by `prefill serve`), and what is read off
the engine to fill it: the model id clients name, the default size of the KV pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prefill.server.openai_schema import MAX_PROMPTS

if TYPE_CHECKING:
    from prefill.engine.llm import Engine


# `prefill serve` probes the machine again at its start when the cached probe is older than this: on a shared host
# the speed drifts by 10-50% over tens of minutes (the Zen 3 of docs/performance.md: a 128-token prefill measured
# 175 ms where a probe 4 hours old predicted 265), and the page's live view and every `timings` read it.
SERVE_PROBE_MAX_AGE_S = 15 * 60.0


@dataclass(frozen=True)
class ServeConfig:
    """Sizes and limits of one server: MiB (`_mb`), bytes, tokens, seconds (`_s`)."""

    model_id: str
    prefix_cache_mb: float = 256.0  # the prefix cache's share of the KV pool; 0 disables it
    kv_cache_mb: float | None = None  # the shared KV pool; None: default_kv_cache_bytes()
    populate_kv: bool = False  # make the pool's pages resident at start (`prefill serve` does; tests need not)
    probe_max_age_s: float | None = None  # probe again at start when the cached probe is older (None: never)
    max_queue: int = 64  # requests that may wait beyond max_running; more get a 429 (Worker.submit)
    max_running: int = 32  # requests prefilled or decoded at once (their decode steps share one batch)
    chunk_size: int = 256  # prefill chunk, interleaved with decode steps
    max_body_bytes: int = 4 * 1024 * 1024
    max_tokens_limit: int = 4096  # the most tokens one request may ask for
    default_max_tokens: int = 256  # when a request names none (OpenAI's completions default is 16)
    max_prompts: int = MAX_PROMPTS  # prompts in one /v1/completions request (one choice each), at most MAX_PROMPTS
    max_echo_tokens: int = 16384  # prompt tokens one request may score (echo with logprobs), all prompts together
    max_unread_events: int = 512  # stream events buffered for a client that does not read; then it is cancelled
    stuck_after_s: float = 120.0  # a busy worker without a loop for this long is stuck: /health 503, exit 1
    supervise_every_s: float = 0.5
    api_key: str | None = field(default=None, repr=False)  # Authorization: Bearer KEY on all but the open paths
    allowed_hosts: tuple[str, ...] | None = None  # Host header names answered (None: any; `prefill serve`: loopback)
    header_timeout_s: float = 10.0  # a connection whose request headers are not complete by then is closed
    body_timeout_s: float = 30.0  # a request body not complete this long after its headers: 408, connection closed
    exact_scoring: bool = True  # echo / logprobs requests run float32 activations (False: --activations named a path)

    def kv_pool_bytes(self, engine: Engine) -> int:
        """Bytes of the KV pool shared by every request: kv_cache_mb, or the default for this engine's device."""
        return default_kv_cache_bytes(engine) if self.kv_cache_mb is None else int(self.kv_cache_mb * 1024**2)


def default_kv_cache_bytes(engine: Engine) -> int:
    """A quarter of the memory free now on the engine's device, at most 2 GiB (`prefill serve` makes its pages
    resident at start, about 0.4 s a GiB here; elsewhere they are touched only as used)."""
    if engine.device.type == "cuda":
        import torch

        free = torch.cuda.mem_get_info(engine.device)[0]
    else:
        import psutil

        free = psutil.virtual_memory().available
    return int(min(free // 4, 2 * 1024**3))


def model_id_of(engine: Engine) -> str:
    """The id clients name in `model`: the weights file or folder name, e.g. SmolLM2-135M-Instruct.Q4_1."""
    name = Path(engine.source).name
    return name.removesuffix(".gguf") or engine.spec.name
