"""The engine: tokenize -> prefill (one parallel pass) -> sample the first token -> decode from the cache.

Every generation is timed: tokenization, prefill, first-token sampling, TTFT, each inter-token latency (ITL)
and the request total. Predictions come from the cost model's time model (`prefill.costmodel.timemodel`) on this
machine's profile (`prefill.machine.profiles`), never from a formula written here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import torch

from prefill.costmodel import costs, timemodel
from prefill.costmodel.ops import Layout, Row
from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec
from prefill.engine.kvcache import KVBatch, KVPool, SeqKV
from prefill.engine.request import Failed, Generation, Request, TokenEvent
from prefill.engine.sampling import SamplingParams
from prefill.errors import BadInput
from prefill.loading import load_model_files
from prefill.loading.tokenizer import Tokenizer
from prefill.model.transformer import Transformer, check_supported


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch dtype from 'float32' / 'fp32' / 'bfloat16' / 'bf16' / 'float16' / 'fp16'."""
    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, costs.canonical_dtype(name))


class Engine:
    """A loaded model on a device, ready to prefill and decode."""

    def __init__(self, model: Transformer, tokenizer: Tokenizer | None, dtype: torch.dtype, device, source=""):
        self.model, self.tokenizer, self.dtype, self.source = model, tokenizer, dtype, source
        self.device = torch.device(device)
        self.spec: ModelSpec = model.spec
        self._profiles: dict[bool, MachineProfile] = {}
        self.cold_prefill_s: float | None = None  # the first prefill after load (warmup), seconds
        self.cold_decode_s: float | None = None  # the first decode step after load, seconds

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

    def new_pool(self, tokens: int) -> KVPool:
        """A private KV pool big enough for `tokens` positions."""
        return KVPool.for_tokens(self.spec, tokens, self.dtype, self.device)

    def new_cache(self, capacity: int) -> SeqKV:
        """An empty cache for one sequence of up to `capacity` tokens, in a pool of its own."""
        return self.new_pool(capacity).new_seq(capacity)

    def _ids_tensor(self, ids) -> torch.Tensor:
        if isinstance(ids, torch.Tensor):
            t = ids if ids.dim() == 2 else ids[None]
        else:
            t = torch.tensor([list(ids)], dtype=torch.long)
        return t.to(self.device)  # [B, P]

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, seqs: list[SeqKV], output: str = "last") -> torch.Tensor:
        """ids [B, T]: row b's T new tokens continue sequence seqs[b] at its own length; returns the model's
        `output` (float32 logits [B, vocab] of each row's last position by default) and advances every seq."""
        batch = KVBatch(seqs, ids.shape[1])
        return self.model(ids, batch.positions(self.device), batch, output)

    @torch.inference_mode()
    def prefill(self, ids, cache: SeqKV | None = None, chunk_size: int | None = None):
        """All P prompt tokens in one forward pass (or in chunks of `chunk_size` against the growing cache).

        Writes cache positions cache.length .. cache.length + P - 1 and returns (logits [1, vocab] float32 of
        the last position, cache).
        """
        x = self._ids_tensor(ids)  # [1, P]
        B, P = x.shape
        if B != 1:
            raise BadInput(f"prefill takes one sequence at a time, got B = {B}")
        if P == 0:
            raise BadInput("the prompt is empty: at least one token is needed")
        if cache is None:
            cache = self.new_cache(P)
        if cache.length + P > self.spec.context_length:
            raise BadInput(
                f"prompt of {cache.length + P} tokens exceeds the model's context length {self.spec.context_length}"
            )
        if chunk_size is not None and chunk_size < 1:
            raise BadInput(f"chunk size must be >= 1, got {chunk_size}")
        step = chunk_size or P
        for s in range(0, P, step):
            logits = self.forward(x[:, s : s + step], [cache])  # [1, vocab]
        return logits, cache

    @torch.inference_mode()
    def decode_step(self, token_ids: torch.Tensor, caches: SeqKV | list[SeqKV]) -> torch.Tensor:
        """One new position per sequence: token_ids [B] -> logits [B, vocab], reading and extending each cache."""
        seqs = [caches] if isinstance(caches, SeqKV) else list(caches)
        return self.forward(token_ids.reshape(-1, 1).to(self.device), seqs)

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
        first = self.cold_prefill_s is None
        t = time.perf_counter()
        logits, cache = self.prefill(list(range(1, P + 1)), self.new_cache(P + 1))  # [1, vocab]
        self.sync()
        t1 = time.perf_counter()
        self.decode_step(logits.argmax(-1), cache)
        self.sync()
        if first:  # cold: page faults, kernel selection, thread start-up; never mixed into a warm figure
            self.cold_prefill_s, self.cold_decode_s = t1 - t, time.perf_counter() - t1

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
        chunk_size: int | None = None,
    ) -> Iterator[TokenEvent | Generation]:
        """Stream TokenEvents as tokens are decoded, then yield the finished Generation last.

        The same step loop as the server's, run for one request in a KV pool of its own.
        """
        from prefill.engine.loop import StepLoop

        if max_new_tokens < 0:
            raise BadInput(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        t0 = time.perf_counter()
        ids = self.encode_prompt(prompt, chat)
        tokenize_s = time.perf_counter() - t0
        if self.spec.context_length < len(ids):
            raise BadInput(f"prompt of {len(ids)} tokens exceeds the model's context length {self.spec.context_length}")
        events: list = []
        req = Request(ids, min(max_new_tokens, self.spec.context_length - len(ids)), sampling or SamplingParams(),
                      self.tokenizer, events.append, tuple(stop), arrival=t0, tokenize_s=tokenize_s)  # fmt: skip
        loop = StepLoop(self, self.new_pool(req.capacity), chunk_size=chunk_size)
        loop.add(req)
        return self._drain(loop, req, events)

    @staticmethod
    def _drain(loop, req: Request, events: list) -> Iterator[TokenEvent | Generation]:
        while not req.done or events:
            if not events:
                loop.step()
            while events:
                ev = events.pop(0)
                if isinstance(ev, Failed):
                    raise ev.error if ev.error is not None else RuntimeError(ev.message)
                yield ev

    def complete(self, prompt, **kw) -> Generation:
        """Run generate() to the end and return the Generation."""
        *_, gen = self.generate(prompt, **kw)
        return gen

    # ---- predictions (from the cost model) ---------------------------------------------------------

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    def profile(self, fitted: bool = True, echo: Callable[[str], None] | None = None) -> MachineProfile:
        """This machine's profile for this model, dtype and thread count (prefill.machine.profiles): the one a
        benchmark fitted when there is one (and `fitted`), else the quick probe's, measured on first need (a few
        seconds; `echo` gets a one-line note) and cached on disk."""
        if fitted not in self._profiles:
            from prefill.machine.profiles import profile_for

            self._profiles[fitted] = profile_for(self.spec, self.dtype_name, str(self.device), fitted=fitted, echo=echo)
        return self._profiles[fitted]

    def layout(self) -> Layout:
        """How this engine stores and runs the model, for the time model. Attention over a cached context reads
        each row's K/V through KVBatch.update, which copies it out of the pool first (gathers_kv)."""
        return timemodel.layout_for(self.dtype_name, gathers_kv=True)

    def gemm_rate(self) -> float:
        """This device's best GEMM rate at the model's shapes in the engine's dtype (FLOP/s), from its profile."""
        return self.profile().peak_flops_per_s

    def predict_prefill(
        self, P: int, past: int = 0, chunk_size: int | None = None, profile: MachineProfile | None = None
    ) -> timemodel.Prediction:
        """The time model's prediction of a warm prefill of P tokens after `past` cached ones (a prefix-cache
        hit: the suffix against the cached context), in chunks of `chunk_size` if given."""
        return timemodel.predict_prefill(self.spec, P, profile or self.profile(), self.layout(), past, 1, chunk_size)

    def predict_decode(self, contexts: list[int], profile: MachineProfile | None = None) -> timemodel.Prediction:
        """The time model's prediction of one decode step (the ITL) of len(contexts) rows, each at its context."""
        return timemodel.predict_decode(self.spec, contexts, profile or self.profile(), self.layout())

    def predict_step(self, rows: list[Row], profile: MachineProfile | None = None) -> timemodel.Prediction:
        """The time model's prediction of one forward of `rows` (each: new tokens, cached past, logits asked), as
        a step of the loop runs them: decode rows and a prefill chunk together, one GEMM per weight."""
        return timemodel.predict_step(self.spec, rows, profile or self.profile(), self.layout())

    def predict_prefill_seconds(self, P: int, past: int = 0, chunk_size: int | None = None) -> tuple[float, str]:
        """Predicted seconds of a warm prefill of P tokens after `past` cached ones (in chunks, if given), and how:
        the time model on this machine's profile, with the part that dominates."""
        pred = self.predict_prefill(P, past, chunk_size)
        return pred.seconds, f"time model, {self.profile().kind} profile: {pred.dominant}-bound"


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
