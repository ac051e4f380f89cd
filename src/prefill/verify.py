"""The proofs: the parallel prefill equals the sequential one, chunks equal one pass, the cache's bytes equal
the formula, and the logits equal a reference implementation's (Hugging Face transformers).

Each check returns a `Check`: what was compared, the measured difference, the tolerance, and whether it holds.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefill import costs
from prefill.engine import Engine


@dataclass(frozen=True)
class Check:
    name: str
    measured: float  # the largest absolute difference (or a byte count for exact checks)
    tolerance: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.measured <= self.tolerance


def _max_cache_diff(a, b, n: int) -> float:
    """Largest |difference| of K and V over positions 0..n-1 of every layer of two SeqKV caches."""
    return max(
        max(float((a.k(i)[:, :, :n] - b.k(i)[:, :, :n]).abs().max()),
            float((a.v(i)[:, :, :n] - b.v(i)[:, :, :n]).abs().max()))
        for i in range(len(a.pool.k))
    )  # fmt: skip


@torch.inference_mode()
def parallel_vs_sequential(engine: Engine, ids: list[int], tol: float = 1e-4) -> list[Check]:
    """One parallel prefill vs feeding the same tokens one at a time through the decode path."""
    P = len(ids)
    logits_par, par = engine.prefill(ids)  # [1, vocab]; cache [1, H_kv, P, d_head] per layer
    seq = engine.new_cache(P)
    for token in ids:
        logits_seq = engine.decode_step(torch.tensor([token]), seq)  # [1, vocab]
    return [
        Check("last-position logits: parallel vs sequential", float((logits_par - logits_seq).abs().max()), tol),
        Check(f"K and V of all {engine.spec.L} layers: parallel vs sequential", _max_cache_diff(par, seq, P), tol),
    ]


@torch.inference_mode()
def chunked_vs_single(engine: Engine, ids: list[int], chunk_size: int, tol: float = 1e-4) -> list[Check]:
    """Chunked prefill (chunks of `chunk_size` against the growing cache) vs one pass."""
    logits_one, one = engine.prefill(ids)
    logits_chunked, chunked = engine.prefill(ids, chunk_size=chunk_size)
    return [
        Check(f"logits: chunks of {chunk_size} vs one pass", float((logits_one - logits_chunked).abs().max()), tol),
        Check(f"K and V: chunks of {chunk_size} vs one pass", _max_cache_diff(one, chunked, len(ids)), tol),
    ]


def kv_bytes_match_formula(engine: Engine, P: int) -> Check:
    """The bytes the cache holds for P tokens against the sum over layers of 2 * B * H_kv * min(P, W_l) * d_head
    * bytes_per_element (2 * L * B * H_kv * P * d_head * b without windows)."""
    _, cache = engine.prefill(list(range(1, P + 1)))
    expected = costs.kv_cache_bytes_for(engine.spec, P, engine.dtype.itemsize)
    return Check(
        "KV-cache bytes held vs formula", abs(cache.nbytes() - expected), 0, f"{cache.nbytes():,} vs {expected:,} B"
    )


def load_reference(source: str, dtype: torch.dtype = torch.float32):
    """The same weights in Hugging Face transformers (a .gguf file needs `accelerate` installed)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()  # its deprecation notices are not ours to show
    path = Path(source)
    if path.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.eval()


@torch.inference_mode()
def parity_with_reference(engine: Engine, reference, ids: list[int], new_tokens: int = 8, tol: float = 1e-3):
    """Last-position logits and K/V against the reference, and the greedy continuation, token for token."""
    x = torch.tensor([ids])
    out = reference(x, use_cache=True)
    ref_logits = out.logits[:, -1].float()  # [1, vocab]
    ours, cache = engine.prefill(ids)
    layers = out.past_key_values.layers if hasattr(out.past_key_values, "layers") else None
    checks = [Check("last-position logits vs transformers", float((ours - ref_logits).abs().max()), tol)]
    if layers is not None:
        P = len(ids)  # a windowed layer of the reference keeps only its last W - 1 positions: compare those
        kv = max(
            max(
                float((cache.k(i)[:, :, P - lay.keys.shape[2] :] - lay.keys).abs().max()),
                float((cache.v(i)[:, :, P - lay.values.shape[2] :] - lay.values).abs().max()),
            )
            for i, lay in enumerate(layers)
        )
        checks.append(Check("K and V of every layer (a windowed one's window) vs transformers", kv, tol))
    # Greedy continuation, EOS not special: the reference recomputes the whole sequence each step.
    seq, ref_tokens = x, []
    for _ in range(new_tokens):
        nxt = reference(seq).logits[:, -1].argmax(-1, keepdim=True)  # [1, 1]
        ref_tokens.append(int(nxt))
        seq = torch.cat([seq, nxt], dim=1)
    _, cache = engine.prefill(ids, engine.new_cache(len(ids) + new_tokens))
    our_tokens, token = [], ours.argmax(-1)  # [1]
    for _ in range(new_tokens):
        our_tokens.append(int(token))
        token = engine.decode_step(token, cache).argmax(-1)
    differ = sum(a != b for a, b in zip(our_tokens, ref_tokens, strict=True))
    checks.append(Check(f"greedy continuation of {new_tokens} tokens: tokens that differ", differ, 0))
    return checks


@torch.inference_mode()
def batched_vs_alone(engine: Engine, prompts: list[list[int]], new_tokens: int = 8, tol: float = 1e-4) -> list[Check]:
    """B prompts of different lengths decoded together (one forward per step, each row at its own position) vs
    each decoded alone: greedy tokens identical, logits within `tol` at every step."""
    from prefill.kvcache import KVPool

    def alone(ids: list[int]) -> tuple[list[int], list[torch.Tensor]]:
        logits, cache = engine.prefill(ids, engine.new_cache(len(ids) + new_tokens))
        tokens, rows = [], []
        for _ in range(new_tokens):
            rows.append(logits[0])
            tokens.append(int(logits[0].argmax()))
            logits = engine.decode_step(torch.tensor([tokens[-1]]), cache)
        return tokens, rows

    pool = KVPool.for_tokens(engine.spec, sum(len(p) + new_tokens + 16 for p in prompts), engine.dtype, engine.device)
    seqs = [pool.new_seq(len(p) + new_tokens) for p in prompts]
    last = torch.stack([engine.prefill(p, s)[0][0] for p, s in zip(prompts, seqs, strict=True)])  # [B, vocab]
    together: list[list[int]] = [[] for _ in prompts]
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    for _ in range(new_tokens):
        for b in range(len(prompts)):
            rows[b].append(last[b])
            together[b].append(int(last[b].argmax()))
        last = engine.decode_step(torch.tensor([t[-1] for t in together]), seqs)  # one forward, B rows
    ref = [alone(p) for p in prompts]
    differ = sum(a != b for t, (r, _) in zip(together, ref, strict=True) for a, b in zip(t, r, strict=True))

    def logits_diff(step_range) -> float:
        return max(
            float((rs[i] - rr[i]).abs().max()) for rs, (_, rr) in zip(rows, ref, strict=True) for i in step_range
        )

    # Step 0 is the prefill's logits (each row alone in both); step 1 is the first batched decode step, from
    # identical caches. After it the caches themselves carry the batched GEMMs' rounding (MKL sums in another
    # order for another M), so later steps drift a little further: shown in the detail, not hidden.
    B, lengths = len(prompts), ", ".join(str(len(p)) for p in prompts)
    first, drift = logits_diff([1]), logits_diff(range(new_tokens))
    return [
        Check(f"batched decode (B = {B}, P = {lengths}) vs alone: tokens that differ over {new_tokens} steps",
              differ, 0),
        Check(f"batched decode (B = {B}) vs alone: logits of one decode step", first, tol,
              f"largest over all {new_tokens} steps {drift:.2g}"),
    ]  # fmt: skip
