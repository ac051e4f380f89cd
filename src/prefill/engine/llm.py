"""The engine's front: a model runner and its tokenizer, with generate / complete / score over the step loop.

`Engine` drives; `ModelRunner` (prefill.engine.runner) is driven. `generate` runs the same step loop as the
server (prefill.engine.loop) for one request in a KV pool of its own; `prefill` and `decode_step` are the
runner's forward under the one chunking rule, for the proofs and the benchmark. Predictions come from the cost
model (prefill.costmodel), never from a formula written here.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from prefill.costmodel import costs, timemodel
from prefill.costmodel.gguf_file import reading_once
from prefill.costmodel.kv_store import DEFAULT_STORE_MB as DEFAULT_KV_STORE_MB
from prefill.costmodel.ops import Layout, Row
from prefill.costmodel.profile import MachineProfile
from prefill.engine.kv_tier import StoreTier
from prefill.engine.kvcache import KVPool, SeqKV, kv_dtype_name, kv_torch_dtype
from prefill.engine.loop import StepLoop
from prefill.engine.prompt import check_prompt, check_text
from prefill.engine.request import Failed, Generation, Request, TokenEvent
from prefill.engine.runner import ModelRunner, torch_dtype
from prefill.engine.sampling import SamplingParams
from prefill.engine.weights import main_type, storage_of, stored_bytes_per_weight, weights_path
from prefill.errors import BadInput
from prefill.loading import load_model_files
from prefill.loading.resolve import model_path
from prefill.loading.tokenizer import Tokenizer
from prefill.machine import heap
from prefill.machine.paths import NATIVE, ServingPath
from prefill.model.quant import set_activations
from prefill.model.quant.activations import default_activations, words
from prefill.model.transformer import check_supported


class Engine:
    """A loaded model and its tokenizer, ready to generate, score, prefill and decode."""

    def __init__(self, runner: ModelRunner, tokenizer: Tokenizer | None, source: str = "") -> None:
        self.runner, self.tokenizer = runner, tokenizer
        self.spec, self.dtype, self.device = runner.spec, runner.dtype, runner.device
        self.model = runner.model
        self.source = source or runner.spec.name
        self.weights = storage_of(runner.model)  # "Q4_1 + Q8_0" for GGUF blocks kept native, else the dense dtype
        self._profiles: dict[tuple[bool, str], MachineProfile] = {}  # (fitted, K/V dtype) -> profile
        self.cold_prefill_s: float | None = None  # the first prefill after load (warmup), seconds
        self.cold_decode_s: float | None = None  # the first decode step after load, seconds
        self.kv_store: StoreTier | None = None  # attach_kv_store
        self.model_file: Path | None = None  # the file or folder it was loaded from (Engine.load; the quality gate's)
        heap.keep_freed_memory()  # a forward's freed activations are reused, not unmapped (prefill.machine.heap)

    # ---- construction ----
    @classmethod
    def load(
        cls,
        model: str | None = None,
        dtype: str | torch.dtype = "float32",
        device: str = "cpu",
        threads: int | None = None,
        progress: bool | Callable[[int, int], None] = True,
        deterministic: bool = False,
        weights: str = "auto",
        kv_store: str | Path | None = None,
        kv_store_mb: float = DEFAULT_KV_STORE_MB,
        activations: str | None = None,
        kv_dtype: str | None = None,
    ) -> Engine:
        """Load a .gguf file, a Hugging Face folder, or (model=None) the embedded SmolLM2-135M-Instruct.

        `deterministic`: the batch-invariant mode (ModelRunner.set_deterministic; dense float32 weights).
        `weights`: "native" keeps a GGUF's quantized matrices as their blocks (float32 activations and KV cache);
        "float32" / "bfloat16" / "float16" decodes them to that dtype, which the engine then runs in; "auto" picks
        the faster here (prefill.engine.weights). `kv_store`: a directory of stored K/V blocks, at most
        `kv_store_mb` MiB (attach_kv_store). `activations`: what native blocks' products take, "f32" (the
        reference; always under `deterministic`) or "q8" (8-bit, on Q4_0/Q4_1/Q8_0 blocks); None: auto's choice
        where it chose (PREFILL_ACTIVATIONS narrows it), else PREFILL_ACTIVATIONS, else f32. `kv_dtype`: what the
        KV pool stores K/V as (float32, bfloat16, float16 or q8_0); None: the dtype the engine computes in."""
        if threads is not None:
            if threads < 1:
                raise BadInput(f"threads must be >= 1, got {threads}")
            torch.set_num_threads(threads)
        if kv_dtype is not None:
            kv_torch_dtype(kv_dtype)  # a bad name fails before the weights load
        if deterministic:
            if weights == NATIVE:
                raise BadInput("the batch-invariant mode runs dense float32 weights: drop --weights native")
            weights = "float32"
        with reading_once():  # the weights' choice and the loader read the same GGUF metadata
            dtype_name = str(torch_dtype(dtype)).removeprefix("torch.")
            acts = activations or "auto"  # chosen: auto's activations, where it chose
            storage, chosen = weights_path(weights, model, dtype_name, device, None, acts)
            dt = torch_dtype("float32" if storage == NATIVE else storage)
            callback = _progress_bar("loading weights") if progress is True else (progress or None)
            try:
                files = load_model_files(model, dt, callback, check=check_supported, native=storage == NATIVE)
            finally:
                if progress is True:
                    callback(-1, -1)
        engine = cls.from_state_dict(files.spec, files.state_dict, files.tokenizer, dt, device, files.source)
        engine.model_file = model_path(model)
        engine.runner.set_kv_dtype(kv_dtype)
        set_activations(engine.model, "f32" if deterministic else activations or chosen or default_activations())
        if deterministic:
            engine.runner.set_deterministic()
        if kv_store is not None:
            engine.attach_kv_store(kv_store, kv_store_mb)
        return engine

    def attach_kv_store(
        self, directory: str | Path, max_mb: float = DEFAULT_KV_STORE_MB, force: str | None = None
    ) -> StoreTier | None:
        """Keep K/V blocks under `directory` (at most `max_mb` MiB, LRU) below the prefix cache: every request
        that leaves writes its whole blocks there in the background, and a later one (also in another process,
        after a restart) loads its longest stored prefix when the cost model predicts loading is faster than
        computing, or loads its tail while computing its head when that is faster still (`force`: "load" or "both"
        whenever a stored prefix is found). None, with one warning, when the directory cannot be used;
        requests are then served without a store."""
        if max_mb <= 0:
            raise BadInput(f"the KV store's size must be > 0 MiB, got {max_mb}")
        if self.kv_store is not None:
            self.kv_store.close()
        self.kv_store = StoreTier.open(
            directory,
            int(max_mb * 1024**2),
            self.model,
            self.kv_dtype_name,
            lambda n, past, chunk: self.predict_prefill_seconds(n, past, chunk)[0],
            force,
        )
        if self.kv_store is not None:  # the time model's inputs (GEMM rate, calibration) now, not in a request's TTFT
            self.predict_prefill_seconds(self.kv_store.block_size)
        return self.kv_store

    @classmethod
    def from_state_dict(cls, spec, state_dict, tokenizer=None, dtype="float32", device="cpu", source="") -> Engine:
        """An engine over weights already in memory, named as in a Hugging Face checkpoint."""
        return cls(ModelRunner.from_state_dict(spec, state_dict, dtype, device), tokenizer, source)

    # ---- the runner's forward, for the proofs and the benchmark ----
    def new_pool(self, tokens: int, kv_dtype: str | None = None) -> KVPool:
        return self.runner.new_pool(tokens, kv_dtype)

    def new_cache(self, capacity: int) -> SeqKV:
        return self.runner.new_cache(capacity)

    def forward(self, ids: torch.Tensor, seqs: list[SeqKV], output: str = "last") -> torch.Tensor:
        return self.runner.forward(ids, seqs, output)

    def prefill(self, ids, cache: SeqKV | None = None, chunk_size: int | None = None):
        """All P prompt tokens in one forward (or in chunks of `chunk_size` against the growing cache, as the step
        loop runs them). Writes cache positions cache.length .. + P - 1; returns (logits [1, vocab], cache)."""
        x = ids if isinstance(ids, torch.Tensor) else torch.tensor([list(ids)], dtype=torch.long)
        x = x if x.dim() == 2 else x[None]  # [1, P]
        if x.shape[0] != 1:
            raise BadInput(f"prefill takes one sequence at a time, got B = {x.shape[0]}")
        past = 0 if cache is None else cache.length
        check_prompt(x[0].tolist(), self.spec, past=past, chunk_size=chunk_size)
        cache = cache or self.new_cache(x.shape[1])
        for start, end in costs.prefill_chunks(x.shape[1], chunk_size):
            logits = self.runner.forward(x[:, start:end], [cache])  # [1, vocab]
        return logits, cache

    def decode_step(self, token_ids: torch.Tensor, caches: SeqKV | list[SeqKV]) -> torch.Tensor:
        """One new position per sequence: token_ids [B] -> logits [B, vocab], reading and extending each cache."""
        seqs = [caches] if isinstance(caches, SeqKV) else list(caches)
        return self.runner.forward(token_ids.reshape(-1, 1), seqs)

    def sync(self) -> None:
        self.runner.sync()

    def threads(self) -> int:
        return self.runner.threads()

    def compile(self) -> float:
        """Compile the per-block functions (see ModelRunner.compile); seconds it took."""
        return self.runner.compile()

    def warmup(self) -> None:
        """One short request through the step loop, as the server runs it (and the chat template's compilation),
        so that kernel selection, thread start-up and template parsing are not timed later."""
        gen = self.complete(self.encode_prompt("warm-up") if self.tokenizer else list(range(1, 17)), max_new_tokens=2)
        self.sync()
        if self.cold_prefill_s is None:  # cold: page faults, kernel selection, threads; never in a warm figure
            self.cold_prefill_s, self.cold_decode_s = gen.prefill_s, (gen.itl_s[0] if gen.itl_s else None)

    # ---- prompts and generation ----
    def need_tokenizer(self) -> Tokenizer:
        if self.tokenizer is None:
            raise BadInput(f"{self.source} has no tokenizer (tokenizer.json): pass token ids instead of text")
        return self.tokenizer

    def encode_prompt(self, prompt: str | list[int], chat: bool = True) -> list[int]:
        """Token ids of a prompt: the chat template applied when asked and available, else the raw text."""
        if not isinstance(prompt, str):
            return [int(i) for i in prompt]
        check_text(prompt)
        tok = self.need_tokenizer()
        if chat and tok.chat_template:
            return tok.encode(tok.render_chat([{"role": "user", "content": prompt}]))
        return tok.encode(prompt, add_special_tokens=True)

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
        t0 = time.perf_counter()
        ids = self.encode_prompt(prompt, chat)
        tokenize_s = time.perf_counter() - t0
        check_prompt(ids, self.spec, max_tokens=max_new_tokens, chunk_size=chunk_size, max_tokens_name="max_new_tokens")
        events: list = []
        req = Request(
            ids,
            max_new_tokens,
            sampling or SamplingParams(),
            self.tokenizer,
            events.append,
            tuple(stop),
            arrival=t0,
            tokenize_s=tokenize_s,
        )
        loop = StepLoop(self.runner, self.new_pool(req.capacity), chunk_size=chunk_size, kv_tier=self.kv_store)
        loop.add(req)
        return _drain(loop, req, events)

    def complete(self, prompt, **kw) -> Generation:
        """Run generate() to the end and return the Generation."""
        *_, gen = self.generate(prompt, **kw)
        return gen

    # ---- predictions (from the cost model's time model) ----
    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")

    @property
    def kv_dtype_name(self) -> str:
        """What the KV pool stores K/V as (costs.KV_DTYPES)."""
        return kv_dtype_name(self.runner.kv_dtype)

    @property
    def kv_bytes(self) -> float:
        """b of the KV formulas: bytes per stored K or V value (costs.kv_bytes_per_element)."""
        return costs.kv_bytes_per_element(self.kv_dtype_name)

    def profile(
        self, fitted: bool = True, echo: Callable[[str], None] | None = None, max_age_s: float | None = None
    ) -> MachineProfile:
        """This machine's profile for this model, dtype and thread count (prefill.machine.profiles): the one a
        benchmark fitted when there is one (and `fitted`), else the quick probe's, measured on first need (a few
        seconds; `echo` gets a one-line note) and cached on disk; a call with `max_age_s` asks again, and a cached
        probe older than that is measured again (a server's start). The engine keeps the profile it got (per K/V
        dtype)."""
        key = (fitted, self.kv_dtype_name)  # decode attention is timed reading K/V as the pool stores them
        if key not in self._profiles or max_age_s is not None:
            from prefill.machine.profiles import profile_for

            device, qtypes = str(self.device), self.weight_types()
            self._profiles[key] = profile_for(
                self.spec,
                self.dtype_name,
                device,
                fitted=fitted,
                echo=echo,
                qtypes=qtypes,
                max_age_s=max_age_s,
                kv_dtype=key[1],
            )
        return self._profiles[key]

    def weight_types(self) -> dict[str, str]:
        """ "KxN" -> the kernel each GEMM's weight kept as blocks runs (none for dense weights), for the profile:
        its GGUF type, "Q4_1:q8" where its products take 8-bit activations (activations.kernel_name)."""
        from prefill.costmodel.profile import shape_key
        from prefill.model.quant.activations import kernel_name

        b = self.model.layers[0]
        weights = (b.wqkv.weight, b.wo.weight, b.w_gate_up.weight, b.w_down.weight, self.model.unembed_weight())
        return {shape_key(w.K, w.N): kernel_name(main_type(w), w.activations) for w in weights if main_type(w)}

    @property
    def activations(self) -> str:
        """What the blocks' products take: "q8" (8-bit activations) where any of them runs so, else "f32"."""
        return "q8" if any(t.endswith(":q8") for t in self.weight_types().values()) else "f32"

    @property
    def serving_path(self) -> ServingPath:
        """The path this engine runs (prefill.machine.paths): its weights' storage, dtype and blocks' activations."""
        return ServingPath(NATIVE if self.weight_types() else self.dtype_name, self.dtype_name, self.activations)

    @property
    def precision(self) -> str:
        """What it computes and stores K/V in: "float32 activations, float32 K/V" ("8-bit activations" where the
        blocks' products round them so)."""
        return f"{words(self.activations, self.dtype_name)} activations, {self.kv_dtype_name} K/V"

    @property
    def path_label(self) -> str:
        """The one label of the path that runs, as every start-up line, page, result file and prediction names
        it: "native Q4_1/Q8_0 blocks, float32 activations, float32 K/V" or "dense bfloat16 weights, bfloat16
        activations, bfloat16 K/V"."""
        qtypes = tuple(self.weights.split(" + ")) if self.weight_types() else ()
        return f"{self.serving_path.label(qtypes)}, {self.kv_dtype_name} K/V"

    def layout(self) -> Layout:
        """How this engine stores and runs the model, for the time model: the weights' bytes as stored (GGUF
        blocks kept native: the mean over the matrices a step reads), attention reading each row's K/V in place
        in the pool, and where its blocks run as fused operators (below the prompt length that makes float32
        copies of the blocks)."""
        w = self.model.layers[0].wqkv.weight
        weights = stored_bytes_per_weight(self.model)  # None: dense, the engine's dtype
        fused = (w.dense_min_m or 2**62) if self.model.kernels.decode_block is not None else 0  # 0: never dense
        kv = self.kv_dtype_name
        return timemodel.layout_for(self.dtype_name, weights, gathers_kv=False, fused_below=fused, kv=kv)

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

    def predict_itl_seconds(self, P: int, n: int) -> float | None:
        """The predicted ITL of a request of P prompt tokens that wrote n tokens, alone on this engine: one decode
        step at its middle context (None for one token: it has no ITL)."""
        return self.predict_decode([P + n // 2]).seconds if n > 1 else None

    def predict_step(self, rows: list[Row], profile: MachineProfile | None = None) -> timemodel.Prediction:
        """The time model's prediction of one forward of `rows` (each: new tokens, cached past, logits asked), as
        a step of the loop runs them: decode rows and a prefill chunk together, one GEMM per weight."""
        return timemodel.predict_step(self.spec, rows, profile or self.profile(), self.layout())

    def predict_prefill_seconds(self, P: int, past: int = 0, chunk_size: int | None = None) -> tuple[float, str]:
        """Predicted seconds of a warm prefill of P tokens after `past` cached ones (in chunks, if given), and how:
        the time model on this machine's profile, with the part that dominates."""
        pred = self.predict_prefill(P, past, chunk_size)
        return pred.seconds, self.method_of(pred)

    def method_of(self, pred: timemodel.Prediction) -> str:
        """How a prediction on this machine's profile was made, and the part that dominates it."""
        return f"time model, {self.profile().kind} profile: {pred.dominant}-bound"


def _drain(loop: StepLoop, req: Request, events: list) -> Iterator[TokenEvent | Generation]:
    while not req.done or events:
        if not events:
            loop.step()
        while events:
            ev = events.pop(0)
            if isinstance(ev, Failed):
                raise ev.error if ev.error is not None else RuntimeError(ev.message)
            yield ev


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
