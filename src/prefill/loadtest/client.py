"""The load-test client: drive any OpenAI-compatible server and time every streamed request.

Works against this package's server, vLLM, SGLang and llama.cpp's server: it speaks only the public
`/v1/completions` and `/v1/chat/completions` streaming protocol (server-sent events ending in
`data: [DONE]`). Requests arrive either at a fixed concurrency (C clients, each sends its next request
when the previous one ends) or as a Poisson process of a given rate (req/s). The run stops at
`duration_s` or after `max_requests`, whichever comes first. Per-request timings go to
`loadtest_report`, which turns them into TTFT / ITL / TPOT / E2E statistics and goodput.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from prefill.errors import BadInput

# Common English words: with byte-level BPE tokenizers each is about one token (after a space), so a
# prompt of n words is about n tokens. The server's usage.prompt_tokens reports the exact count.
_WORD_TEXT = (
    "the of and to in is was for on that with as by at from his her they this are be have had not but "
    "what all were when we there can an your which their said if do will each about how up out them "
    "then she many some so these would other into has more two like him see time could no make than "
    "first been its who now people my made over did down only way find use may water long little very "
    "after words called just where most know get through back much before go good new write our used me "
    "man too any day same right look think also around another came come work three word must because "
    "does part even place well such here take why things help put years different away again off went "
    "old number great tell men say small every found still between name should home big give air line "
    "set own under read last never us left end along while might next sound below saw something thought"
)
_WORDS = _WORD_TEXT.split()


@dataclass(frozen=True)
class PromptLengths:
    """Where prompt lengths (in approximate tokens) come from: fixed, uniform [lo, hi], or a list."""

    lo: int
    hi: int
    choices: tuple[int, ...] = ()

    @classmethod
    def parse(cls, spec: str) -> PromptLengths:
        """`128` (fixed), `64:512` (uniform, inclusive), or `@lengths.txt` (one integer per line)."""
        try:
            if spec.startswith("@"):
                path = Path(spec[1:])
                values = tuple(int(x) for x in path.read_text().split())
                if not values:
                    raise BadInput(f"prompt-length file {path} holds no integers")
                out = cls(min(values), max(values), values)
            elif ":" in spec:
                lo, hi = (int(x) for x in spec.split(":", 1))
                out = cls(lo, hi)
            else:
                out = cls(int(spec), int(spec))
        except (OSError, ValueError) as e:
            if isinstance(e, BadInput):
                raise
            raise BadInput(
                f"cannot read prompt lengths {spec!r} ({e}); use 128, 64:512 or @file (one integer per line)"
            ) from e
        if out.lo < 1 or out.hi < out.lo:
            raise BadInput(f"prompt lengths {spec!r} must be >= 1 and lo <= hi")
        return out

    def sample(self, rng: random.Random) -> int:
        """One prompt length in tokens."""
        return rng.choice(self.choices) if self.choices else rng.randint(self.lo, self.hi)

    def describe(self) -> str:
        if self.choices:
            return f"from file ({len(self.choices)} values, {self.lo}..{self.hi})"
        return f"{self.lo}" if self.lo == self.hi else f"uniform {self.lo}..{self.hi}"


def synthetic_prompt(n_tokens: int, rng: random.Random) -> str:
    """About `n_tokens` tokens of random common words (random so no two prompts share a long prefix)."""
    return " ".join(rng.choice(_WORDS) for _ in range(n_tokens))


@dataclass(frozen=True)
class LoadTestConfig:
    """One load test. Times in seconds; rate in requests per second."""

    url: str
    model: str | None = None  # None: ask GET /v1/models and use the first id
    chat: bool = False  # /v1/chat/completions instead of /v1/completions
    concurrency: int = 4  # fixed-concurrency mode when rate is None
    think_s: float = 0.0  # fixed concurrency: each stream waits U(0, 2 think_s) before its next request
    rate: float | None = None  # Poisson arrivals at this rate (concurrency then caps in-flight requests)
    duration_s: float = 60.0
    max_requests: int = 100
    prompt_lengths: PromptLengths = field(default_factory=lambda: PromptLengths(128, 128))
    prompts: tuple[str, ...] = ()  # real prompts (cycled); overrides prompt_lengths
    system_prompt: str | None = None  # shared by every request (a system message, or text before the prompt)
    max_tokens: int = 64
    temperature: float = 0.0
    seed: int = 0
    include_usage: bool = True  # stream_options.include_usage (token counts from the server)
    tokenizer: str | None = None  # a .gguf or model folder whose tokenizer counts tokens where the server gives none
    ignore_eos: bool = False  # ask for exactly max_tokens (vLLM, SGLang and llama.cpp's server accept it)
    api_key: str | None = None
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise BadInput("concurrency must be >= 1")
        if self.rate is not None and not self.rate > 0:
            raise BadInput("rate must be > 0 requests per second")
        if self.think_s < 0:
            raise BadInput("think time must be >= 0 seconds")
        if not self.duration_s > 0 or self.max_requests < 1:
            raise BadInput("duration must be > 0 seconds and requests >= 1")
        if self.max_tokens < 1:
            raise BadInput("max_tokens must be >= 1")


@dataclass
class RequestRecord:
    """What one request did, as seen by the client. Times are seconds from the run's start."""

    index: int
    prompt_chars: int
    start: float
    first_content: float | None = None  # first chunk whose text is non-empty
    chunk_times: list[float] = field(default_factory=list)  # arrival of each chunk with non-empty text
    end: float | None = None
    n_chunks: int = 0
    usage_completion_tokens: int | None = None
    usage_prompt_tokens: int | None = None
    cached_tokens: int | None = None
    finish_reason: str | None = None
    server_timings: dict | None = None  # the `timings` object of our server (other servers send none)
    error: str | None = None
    counted: bool = False  # the usage_* counts are the client's (cfg.tokenizer): the server streamed none

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first_content is not None

    @property
    def n_out(self) -> int:
        """Output tokens: the server's usage when it gave one, else the number of content chunks."""
        if self.usage_completion_tokens is not None:
            return self.usage_completion_tokens
        return self.n_chunks


Counter = Callable[[RequestRecord, dict, str], None]  # (record, request body, output text): fills usage_*


def token_counter(model: str | Path) -> Counter:
    """Counts a request's tokens with `model`'s tokenizer (a .gguf file or model folder), for a server that streams
    no usage (llama-cpp-python's): the prompt as the server would render it (the chat template for messages, the
    model's BOS where it adds one), the output text re-tokenized. Marked `counted` in the record: re-tokenizing
    text can differ from the tokens sampled by a token at a seam."""
    from prefill.loading.resolve import load_tokenizer

    tok = load_tokenizer(model)

    def count(rec: RequestRecord, body: dict, text: str) -> None:
        prompt = tok.render_chat(body["messages"]) if "messages" in body else body["prompt"]
        rec.usage_prompt_tokens = len(tok.encode(prompt, add_special_tokens="messages" not in body))
        rec.usage_completion_tokens = len(tok.encode(text))
        rec.counted = True

    return count


async def resolve_model(client: httpx.AsyncClient, url: str) -> str:
    """The first model id the server lists at GET /v1/models."""
    r = await client.get(f"{url}/v1/models")
    r.raise_for_status()
    data = r.json().get("data") or []
    if not data:
        raise BadInput(f"{url}/v1/models lists no model; pass --model")
    return data[0]["id"]


def _text_of(chunk: dict, chat: bool) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    if chat:
        return (choices[0].get("delta") or {}).get("content") or ""
    return choices[0].get("text") or ""


def request_body(cfg: LoadTestConfig, model: str, prompt: str) -> tuple[str, dict]:
    """The route and the JSON body of one streaming request for `prompt`, as the config asks (chat or completion,
    the system prompt, usage in the stream, ignore_eos)."""
    body: dict = {
        "model": model,
        "max_tokens": cfg.max_tokens,
        "temperature": cfg.temperature,
        "stream": True,
    }
    if cfg.include_usage:
        body["stream_options"] = {"include_usage": True}
    if cfg.ignore_eos:
        body["ignore_eos"] = True
    if cfg.chat:
        system = [{"role": "system", "content": cfg.system_prompt}] if cfg.system_prompt else []
        body["messages"] = [*system, {"role": "user", "content": prompt}]
        return "/v1/chat/completions", body
    prefix = f"{cfg.system_prompt}\n\n" if cfg.system_prompt else ""
    body["prompt"] = prefix + prompt
    return "/v1/completions", body


def take_chunk(rec: RequestRecord, chunk: dict, now: float, chat: bool) -> str:
    """Record one streamed chunk that arrived `now` seconds into the run: its text's clock, the finish reason, the
    usage and the server's timings; returns the chunk's text ("" for none)."""
    if piece := _text_of(chunk, chat):
        rec.n_chunks += 1
        rec.chunk_times.append(now)
        if rec.first_content is None:
            rec.first_content = now
    for c in chunk.get("choices") or []:
        rec.finish_reason = c.get("finish_reason") or rec.finish_reason
    if usage := chunk.get("usage"):
        rec.usage_completion_tokens = usage.get("completion_tokens")
        rec.usage_prompt_tokens = usage.get("prompt_tokens")
        rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
    rec.server_timings = chunk.get("timings") or rec.server_timings
    return piece


async def one_request(
    client: httpx.AsyncClient,
    cfg: LoadTestConfig,
    model: str,
    prompt: str,
    rec: RequestRecord,
    t0: float,
    count: Counter | None = None,
) -> None:
    """Send one streaming request and fill `rec` with what arrived when; `count` fills its token counts where
    the server streamed none (token_counter)."""
    path, body = request_body(cfg, model, prompt)
    text: list[str] = []
    try:
        async with client.stream("POST", f"{cfg.url}{path}", json=body) as r:
            if r.status_code != 200:
                rec.error = f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:200]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                now = time.perf_counter() - t0
                chunk = json.loads(payload)
                if "error" in chunk:
                    rec.error = str(chunk["error"])[:200]
                    return
                text.append(take_chunk(rec, chunk, now, cfg.chat))
            rec.end = time.perf_counter() - t0
            if rec.first_content is None:
                rec.error = "stream ended without any content"
            elif count is not None and rec.usage_completion_tokens is None:
                count(rec, body, "".join(text))
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        rec.error = f"{type(e).__name__}: {e}"[:200]


@dataclass
class _Run:
    """One load test in flight: its client, the records so far, and its clock (t0 and the deadline, in
    perf_counter seconds)."""

    client: httpx.AsyncClient
    cfg: LoadTestConfig
    model: str
    count: Counter | None
    rng: random.Random
    t0: float
    deadline: float
    records: list[RequestRecord] = field(default_factory=list)

    def new_record(self) -> tuple[RequestRecord, str] | None:
        """The next request's record and prompt, or None once the run's count or duration is reached."""
        if len(self.records) >= self.cfg.max_requests or time.perf_counter() >= self.deadline:
            return None
        if self.cfg.prompts:
            prompt = self.cfg.prompts[len(self.records) % len(self.cfg.prompts)]
        else:
            prompt = synthetic_prompt(self.cfg.prompt_lengths.sample(self.rng), self.rng)
        rec = RequestRecord(len(self.records), len(prompt), time.perf_counter() - self.t0)
        self.records.append(rec)
        return rec, prompt

    async def send(self, rec: RequestRecord, prompt: str) -> None:
        """One request, bounded by the run's duration: a request still running at the deadline is cancelled and
        reported as an error rather than holding the run open."""
        request = one_request(self.client, self.cfg, self.model, prompt, rec, self.t0, self.count)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(request, timeout=max(0.0, self.deadline - time.perf_counter()))


async def closed_loop(run: _Run) -> None:
    """`concurrency` users, each sending its next request when the last one ends (after a think time)."""
    think = random.Random(run.cfg.seed + 1)  # its own draws: the prompts stay those of the seed

    async def user() -> None:
        while (item := run.new_record()) is not None:
            await run.send(*item)
            if run.cfg.think_s:
                await asyncio.sleep(think.uniform(0.0, 2 * run.cfg.think_s))

    await asyncio.gather(*(user() for _ in range(run.cfg.concurrency)))


async def poisson_arrivals(run: _Run) -> None:
    """Requests arriving at `rate` a second (exponential gaps, mean 1/rate), at most `concurrency` in flight."""
    in_flight = asyncio.Semaphore(run.cfg.concurrency)

    async def limited(rec: RequestRecord, prompt: str) -> None:
        async with in_flight:
            await run.send(rec, prompt)

    tasks = []
    while (item := run.new_record()) is not None:
        tasks.append(asyncio.create_task(limited(*item)))
        await asyncio.sleep(min(run.rng.expovariate(run.cfg.rate), max(0.0, run.deadline - time.perf_counter())))
    await asyncio.gather(*tasks)


async def run_load_test(cfg: LoadTestConfig) -> tuple[list[RequestRecord], float, str]:
    """Run the load test; returns (records, wall seconds, model id)."""
    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    limits = httpx.Limits(max_connections=cfg.concurrency + 4, max_keepalive_connections=cfg.concurrency)
    timeout = httpx.Timeout(cfg.timeout_s, connect=10.0)
    async with httpx.AsyncClient(headers=headers, limits=limits, timeout=timeout) as client:
        model = cfg.model or await resolve_model(client, cfg.url)
        count = token_counter(cfg.tokenizer) if cfg.tokenizer else None
        t0 = time.perf_counter()
        run = _Run(client, cfg, model, count, random.Random(cfg.seed), t0, t0 + cfg.duration_s)
        await (closed_loop(run) if cfg.rate is None else poisson_arrivals(run))
        wall = time.perf_counter() - t0
    for rec in run.records:
        if rec.error is None and rec.end is None:
            rec.error = "not finished before the run's duration"
    return run.records, wall, model
