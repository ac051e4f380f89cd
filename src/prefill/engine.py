"""The engine: tokenize -> prefill (one parallel pass) -> sample the first token -> decode from the cache.

Every generation is timed: tokenization, prefill, first-token sampling, TTFT, each inter-token latency (ITL)
and the request total. Predictions come from `prefill.costs`, never from a formula written here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from prefill import costs
from prefill.errors import BadInput
from prefill.kvcache import KVCache
from prefill.loading import load_model_files
from prefill.loading.tokenizer import Tokenizer
from prefill.model import Transformer, check_supported
from prefill.sampling import SamplingParams, sample
from prefill.specs import ModelSpec
from prefill.streaming import TextStream


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch dtype from 'float32' / 'fp32' / 'bfloat16' / 'bf16' / 'float16' / 'fp16'."""
    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, costs.canonical_dtype(name))


@dataclass
class TokenEvent:
    """One generated token: its id, the text it adds (after stop-string hold-back), and seconds since start."""

    token_id: int
    text: str
    t: float


@dataclass
class Generation:
    """A finished request with its measured timings (seconds)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "stop" (EOS or stop string) | "length"
    tokenize_s: float = 0.0
    prefill_s: float = 0.0
    first_token_s: float = 0.0  # sampling the first token from the prefill's logits
    ttft_s: float = 0.0
    itl_s: list[float] = field(default_factory=list)
    total_s: float = 0.0
    cached_tokens: int = 0  # prompt tokens whose K/V came from a cache instead of this prefill

    @property
    def P(self) -> int:
        return len(self.prompt_ids)


class Engine:
    """A loaded model on a device, ready to prefill and decode."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer | None, dtype: torch.dtype, device, source=""):
        self.model, self.tokenizer, self.dtype, self.source = model, tokenizer, dtype, source
        self.device = torch.device(device)
        self.spec: ModelSpec = model.spec
        self._gemm_rate: float | None = None
        self.last_cache_bytes = 0  # K/V bytes held after the latest generation's prefill (measured)
        self.last_cache_shape = (0, 0, 0, 0)  # one layer's K (or V) as filled then: [B, H_kv, P, d_head]

    # ---- construction ------------------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        model: str | None = None,
        dtype: str | torch.dtype = "float32",
        device: str = "cpu",
        threads: int | None = None,
        progress: bool | Callable[[int, int], None] = True,
    ) -> Engine:
        """Load a .gguf file, a Hugging Face folder, or (model=None) the embedded SmolLM2-135M-Instruct."""
        if threads is not None:
            if threads < 1:
                raise BadInput(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        dt = torch_dtype(dtype)
        callback = _progress_bar("loading weights") if progress is True else (progress or None)
        try:
            files = load_model_files(model, dt, callback, check=check_supported)
        finally:
            if progress is True:
                callback(-1, -1)
        return cls.from_state_dict(files.spec, files.state_dict, files.tokenizer, dt, device, files.source)

    @classmethod
    def from_state_dict(cls, spec, state_dict, tokenizer=None, dtype="float32", device="cpu", source="") -> Engine:
        """An engine over weights already in memory, named as in a Hugging Face checkpoint."""
        dt = torch_dtype(dtype)
        with torch.device("meta"):
            model = Transformer(spec)
        model = model.materialize(device, dt)
        model.load_hf_state_dict(state_dict)
        model.eval().requires_grad_(False)
        return cls(model, tokenizer, dt, device, source or spec.name)

    # ---- the two phases ----------------------------------------------------------------------------

    def new_cache(self, capacity: int, B: int = 1) -> KVCache:
        """An empty cache for B sequences of up to `capacity` tokens."""
        s = self.spec
        return KVCache(s.L, B, s.H_kv, capacity, s.d_head, self.dtype, self.device)

    def _ids_tensor(self, ids) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            t = ids if ids.dim() == 2 else ids[None]
        else:
            t = torch.tensor([list(ids)], dtype=torch.long)
        return t.to(self.device)  # [B, P]

    @torch.inference_mode()
    def prefill(self, ids, cache: KVCache | None = None, chunk_size: int | None = None):
        """All P prompt tokens in one forward pass (or in chunks of `chunk_size` against the growing cache).

        Writes cache positions cache.length .. cache.length + P - 1 and returns (logits [B, vocab] float32 of
        the last position, cache).
        """
        x = self._ids_tensor(ids)  # [B, P]
        B, P = x.shape
        if P == 0:
            raise BadInput("the prompt is empty: at least one token is needed")
        if cache is None:
            cache = self.new_cache(P, B)
        if cache.length + P > self.spec.context_length:
            raise BadInput(
                f"prompt of {cache.length + P} tokens exceeds the model's context length {self.spec.context_length}"
            )
        if chunk_size is not None and chunk_size < 1:
            raise BadInput(f"chunk size must be >= 1, got {chunk_size}")
        step = chunk_size or P
        for s in range(0, P, step):
            logits = self.model(x[:, s : s + step], cache)  # [B, vocab]
        return logits, cache

    @torch.inference_mode()
    def decode_step(self, token_ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """One new position per sequence: token_ids [B] -> logits [B, vocab], reading and extending the cache."""
        return self.model(token_ids.reshape(-1, 1).to(self.device), cache)

    def compile(self) -> float:
        """Compile the per-block functions with torch.compile; returns the seconds the compiling took.

        The first prefill and the first decode step each build a graph (any P after that reuses it).
        """
        t = time.perf_counter()
        self.model.compile()
        self.warmup()
        return time.perf_counter() - t

    def warmup(self, P: int = 16) -> None:
        """One short prefill and decode step (and the chat template's compilation), so that kernel selection,
        thread start-up and template parsing are not timed."""
        if self.tokenizer is not None and self.tokenizer.chat_template:
            self.encode_prompt("warm-up")
        logits, cache = self.prefill(list(range(1, P + 1)), self.new_cache(P + 1))
        self.decode_step(logits.argmax(-1), cache)
        self.sync()

    @staticmethod
    def threads() -> int:
        """Threads torch uses for the CPU kernels."""
        return torch.get_num_threads()

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    # ---- prompts and generation --------------------------------------------------------------------

    def need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise BadInput(f"{self.source} has no tokenizer (tokenizer.json): pass token ids instead of text")
        return self.tokenizer

    def encode_prompt(self, prompt: str | list[int], chat: bool = True) -> list[int]:
        """Token ids of a prompt: the chat template applied when asked and available, else the raw text."""
        if not isinstance(prompt, str):
            ids = [int(i) for i in prompt]
        else:
            if not prompt.strip():
                raise BadInput("the prompt is empty")
            tok = self.need_tokenizer()
            if chat and tok.chat_template:
                ids = tok.encode(tok.render_chat([{"role": "user", "content": prompt}]))
            else:
                ids = tok.encode(prompt, add_special_tokens=True)
        if not ids:
            raise BadInput("the prompt is empty: at least one token is needed")
        if max(ids) >= self.spec.vocab_size or min(ids) < 0:
            raise BadInput(f"token ids must lie in [0, {self.spec.vocab_size})")
        return ids

    def generate(
        self,
        prompt: str | list[int],
        *,
        chat: bool = True,
        max_new_tokens: int = 64,
        sampling: SamplingParams | None = None,
        stop: tuple[str, ...] | list[str] = (),
        cache: KVCache | None = None,
        chunk_size: int | None = None,
    ) -> Iterator[TokenEvent | Generation]:
        """Stream TokenEvents as tokens are decoded, then yield the finished Generation last.

        A `cache` already holding a prefix of this prompt's tokens (cache.length of them) is reused: only the
        rest is prefilled.
        """
        if max_new_tokens < 0:
            raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        sampling = sampling or SamplingParams()
        t0 = time.perf_counter()
        ids = self.encode_prompt(prompt, chat)
        gen = Generation(prompt_ids=ids, tokenize_s=time.perf_counter() - t0)
        P = len(ids)
        if self.spec.context_length < P:
            raise BadInput(f"prompt of {P} tokens exceeds the model's context length {self.spec.context_length}")
        max_new_tokens = min(max_new_tokens, self.spec.context_length - P)
        capacity = P + max_new_tokens
        if cache is None or cache.capacity < capacity:
            cache = self.new_cache(capacity)
        reused = min(cache.length, P - 1)  # at least one prompt token must run to produce the first logits
        cache.truncate(reused)
        gen.cached_tokens = reused
        return self._generate(gen, cache, max_new_tokens, sampling, tuple(stop), chunk_size, t0)

    def _generate(self, gen, cache, max_new_tokens, sampling, stop, chunk_size, t0):
        tok = self.tokenizer
        if max_new_tokens == 0:
            gen.total_s = time.perf_counter() - t0
            yield gen
            return
        t = time.perf_counter()
        logits, cache = self.prefill(gen.prompt_ids[cache.length :], cache, chunk_size)
        self.sync()
        gen.prefill_s = time.perf_counter() - t
        self.last_cache_bytes, self.last_cache_shape = cache.nbytes(), cache.shape()
        generator = sampling.generator(self.device)
        t = time.perf_counter()
        token = sample(logits, sampling, generator)  # [1]
        token_id = int(token[0])
        gen.first_token_s = time.perf_counter() - t
        gen.ttft_s = costs.ttft_seconds(gen.prefill_s + gen.first_token_s, tokenize_s=gen.tokenize_s)
        texts = TextStream(tok, stop) if tok is not None else None
        last = time.perf_counter()
        eos = tok.eos_ids if tok is not None else set()
        while True:
            if token_id in eos:
                gen.finish_reason = "stop"
                break
            gen.token_ids.append(token_id)
            piece, stopped = texts.add(token_id) if texts else ("", False)
            yield TokenEvent(token_id, piece, time.perf_counter() - t0)
            if stopped:
                gen.finish_reason = "stop"
                break
            if len(gen.token_ids) >= max_new_tokens:
                break
            logits = self.decode_step(token, cache)
            token = sample(logits, sampling, generator)
            token_id = int(token[0])
            now = time.perf_counter()
            gen.itl_s.append(now - last)
            last = now
        if texts is not None:
            if gen.finish_reason != "stop" or token_id in eos:
                tail = texts.flush()
                if tail:
                    yield TokenEvent(-1, tail, time.perf_counter() - t0)
            gen.text = texts.sent
        gen.total_s = time.perf_counter() - t0
        yield gen

    def complete(self, prompt, **kw) -> Generation:
        """Run generate() to the end and return the Generation."""
        *_, gen = self.generate(prompt, **kw)
        return gen

    # ---- predictions (from the cost model) ---------------------------------------------------------

    def gemm_rate(self) -> float:
        """This device's GEMM rate in the engine's dtype (FLOP/s), measured once and remembered."""
        if self._gemm_rate is None:
            from prefill.hardware import measure_gemm_rate

            self._gemm_rate = measure_gemm_rate(str(self.dtype).removeprefix("torch."), str(self.device))
        return self._gemm_rate

    def predict_prefill_seconds(self, P: int, past: int = 0, chunk_size: int | None = None) -> tuple[float, str]:
        """Predicted seconds of a prefill of P tokens after `past` cached ones (in chunks, if given), and how:
        a saved calibration for this dtype and thread count if any, else exact FLOPs at the measured GEMM rate."""
        from prefill.hardware import load_calibration

        dtype = str(self.dtype).removeprefix("torch.")
        cal = load_calibration() if self.device.type == "cpu" else None
        use_cal = cal is not None and cal.dtype == dtype and cal.threads == torch.get_num_threads()
        step = chunk_size or P
        seconds = 0.0
        for s in range(0, P, step):  # each chunk attends to everything before it
            count = costs.prefill_flops_exact(self.spec, min(step, P - s), past + s)
            if use_cal:
                seconds += costs.calibrated_prefill_seconds(count, cal)
            else:
                seconds += costs.compute_seconds(count.total, self.gemm_rate())
        return seconds, "calibrated" if use_cal else "exact FLOPs / measured GEMM rate"


def _progress_bar(label: str) -> Callable[[int, int], None]:
    """A rich progress bar driven by (done, total) calls; (-1, -1) closes it."""
    from rich.progress import Progress

    bar = Progress(transient=True)
    task = None

    def update(done: int, total: int) -> None:
        nonlocal task
        if done < 0:
            bar.stop()
            return
        if task is None:
            bar.start()
            task = bar.add_task(label, total=total)
        bar.update(task, completed=done)

    return update
