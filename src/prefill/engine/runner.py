"""The model runner: a loaded Transformer on a device, and the one forward the step loop drives.

It knows weights, devices and kernels; nothing of requests, tokenizers or sampling. The step loop
(prefill.engine.loop) calls `run` once a step for its decode rows and prefill chunks together; the proofs, the
benchmark and the warm-up call `forward`, its rectangular wrapper, so what they measure is what serves.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch

from prefill.costmodel import costs
from prefill.costmodel.specs import ModelSpec
from prefill.engine.batch import forward_batch
from prefill.engine.kvcache import KVPool, SeqKV, kv_torch_dtype
from prefill.model.quant import QuantWeight, fused, set_activations
from prefill.model.transformer import Transformer


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """torch dtype from 'float32' / 'fp32' / 'bfloat16' / 'bf16' / 'float16' / 'fp16'."""
    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, costs.canonical_dtype(name))


class ModelRunner:
    """A Transformer with its weights loaded, on one device, in one dtype; its KV pools in `kv_dtype`."""

    def __init__(self, model: Transformer, dtype: torch.dtype, device, deterministic: bool = False) -> None:
        self.model, self.dtype, self.device = model, dtype, torch.device(device)
        self.kv_dtype = dtype  # what new pools store K/V as (set_kv_dtype)
        self.spec: ModelSpec = model.spec
        self.deterministic = False
        self._shapes: set[tuple[int, int]] = set()  # (thread, tokens) of every forward run so far
        self.first_of_shape = False  # the last forward was the first with its token count on its thread
        if deterministic:
            self.set_deterministic()

    @classmethod
    def from_state_dict(cls, spec: ModelSpec, state_dict, dtype="float32", device="cpu") -> ModelRunner:
        """A runner over weights already in memory, named as in a Hugging Face checkpoint."""
        dt = torch_dtype(dtype)
        with torch.device("meta"):
            model = Transformer(spec)
        model = model.materialize(device, dt)
        model.load_hf_state_dict(state_dict)
        model.eval().requires_grad_(False)
        fused.install(model)  # GGUF blocks: each block's work around attention in two operators
        return cls(model, dt, device)

    # ---- the cache ----
    def set_kv_dtype(self, name: str | torch.dtype | None) -> None:
        """Store K/V as `name` (costs.KV_DTYPES) in the pools made from now on; None: the compute dtype. Attention
        reads them widened to float32 (prefill.model.attention), so 16-bit K/V halve the bytes a decode step reads."""
        self.kv_dtype = self.dtype if name is None else kv_torch_dtype(name)

    def new_pool(self, tokens: int, kv_dtype: str | None = None) -> KVPool:
        """A private KV pool big enough for `tokens` positions, K/V stored as `kv_dtype` (None: kv_dtype's)."""
        kv = self.kv_dtype if kv_dtype is None else kv_torch_dtype(kv_dtype)
        return KVPool.for_tokens(self.spec, tokens, kv, self.device)

    def new_cache(self, capacity: int) -> SeqKV:
        """An empty cache for one sequence of up to `capacity` tokens, in a pool of its own."""
        return self.new_pool(capacity).new_seq()

    # ---- the forward ----
    @contextlib.contextmanager
    def exact(self):
        """The forwards inside run their blocks' products on float32 activations (the reference), whatever path
        the engine serves on, and the path is put back after: a scoring request's steps run so (StepLoop)."""
        paths = {
            m.weight.activations for m in self.model.modules() if isinstance(getattr(m, "weight", None), QuantWeight)
        }
        if paths <= {"f32"}:
            yield
            return
        set_activations(self.model, "f32")
        try:
            yield
        finally:
            set_activations(self.model, paths.pop() if len(paths) == 1 else "q8")

    @torch.inference_mode()
    def run(self, rows: list[tuple[SeqKV, list[int]]], output: str = "last") -> torch.Tensor:
        """One forward over rows [(seq, new token ids)] of any lengths (decode rows and prefill chunks together):
        each row's tokens continue its sequence at its own length. Returns the model's `output` (float32 logits
        [R, vocab] of each row's last token by default; "all" [N, vocab]; "hidden" [N, d_model]) and advances
        every seq (blocks for the new positions are reserved here if the scheduler has not already)."""
        for seq, ids in rows:
            seq.reserve(seq.length + len(ids))
        pool = rows[0][0].pool
        batch = forward_batch(pool, [(seq, len(ids)) for seq, ids in rows], self.device, self.deterministic)
        flat = torch.tensor([t for _, ids in rows for t in ids], dtype=torch.long, device=self.device)  # [N]
        # Cold: a forward of a token count this thread never ran builds its kernels (oneDNN's bfloat16 GEMMs: +40%
        # at 3-40 tokens, 2 cores) and a new thread touches its pools first; such a time is not a warm figure.
        shape = (threading.get_ident(), len(flat))
        self.first_of_shape = shape not in self._shapes
        self._shapes.add(shape)
        out = self.model(flat, batch, output)
        for seq, ids in rows:
            seq.length += len(ids)
            seq.trim()  # a windowed group lets go of what left its window
        return out

    def forward(self, ids: torch.Tensor, seqs: list[SeqKV], output: str = "last") -> torch.Tensor:
        """ids [B, T]: row b's T new tokens continue sequence seqs[b] at its own length; returns the model's
        `output`: float32 logits [B, vocab] of each row's last position, "all" [B, T, vocab], "hidden"
        [B, T, d_model]. The rectangular form of `run`, for the proofs and the benchmark."""
        B, T = ids.shape
        out = self.run(list(zip(seqs, ids.tolist(), strict=True)), output)
        return out if output == "last" else out.view(B, T, -1)

    def sync(self) -> None:
        """Wait for the device (CUDA runs asynchronously; a CPU forward has finished when it returns)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()

    @staticmethod
    def threads() -> int:
        """Threads torch uses for the CPU kernels."""
        return torch.get_num_threads()

    def set_deterministic(self) -> None:
        """The batch-invariant mode: every GEMM and every query's attention sums in one fixed order whatever the
        batch, so a request's logits are bitwise the same alone, in any batch, at any chunk size (the C++
        kernels of prefill.model.kernels; float32 on the CPU)."""
        from prefill.errors import BadInput
        from prefill.model import kernels

        if self.device.type != "cpu" or self.dtype != torch.float32:
            raise BadInput("--deterministic runs float32 on the CPU (use --dtype float32)")
        if not kernels.available():
            raise BadInput(
                "--deterministic needs the engine's C++ kernels, which could not be built here "
                "(install a C++ compiler, then run make install)"
            )
        self.deterministic = True
        self.model.kernels.set_deterministic()

    # ---- set-up ----
    def compile(self) -> float:
        """Compile the per-block functions with torch.compile and build their graphs (one prefill and one decode
        step: any P after that reuses them); returns the seconds it took."""
        t = time.perf_counter()
        self.model.compile()
        self.warmup()
        return time.perf_counter() - t

    def warmup(self, P: int = 16) -> None:
        """One P-token prefill and one decode step through `forward`, so that kernel selection, thread start-up
        and (compiled) graph building are not timed later."""
        cache = self.new_cache(P + 1)
        logits = self.forward(torch.arange(1, P + 1)[None], [cache])  # [1, vocab]
        self.forward(logits.argmax(-1)[:, None], [cache])
        self.sync()
