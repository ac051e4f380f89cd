"""The proofs: the parallel prefill equals the sequential one, chunks equal one pass, the cache's bytes equal
the formula, and the logits equal a reference implementation's (Hugging Face transformers).

Each check returns a `Check`: what was compared, the measured difference, the tolerance, and whether it holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from prefill.costmodel import costs
from prefill.engine.llm import Engine


@dataclass(frozen=True)
class Check:
    name: str
    measured: float  # the largest absolute difference (or a byte count for exact checks)
    tolerance: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.measured <= self.tolerance


def rounding_tolerance(magnitude: float, spec, dtype: torch.dtype) -> float:
    """The largest |difference| two correct computations of values of this magnitude may show when their sums run
    in another order (another GEMM row count M, another chunk split, another kernel): no two such runs are bitwise
    equal, so a proof must allow this much and no more.

    tolerance = u * sqrt(K) * L * magnitude, with u the dtype's unit roundoff (2^-24 for float32), K the longest
    inner dimension of the model's GEMMs (a sum of K rounded terms drifts like a random walk, by about sqrt(K) * u
    of its magnitude) and L the layers (each adds its own rounding and passes the earlier ones on through the
    residual stream). SmolLM2-135M in float32: u = 6.0e-8, K = 1,536, L = 30 -> 7.0e-5 of the magnitude, 1.8e-3
    at logits of magnitude 25. A wrong position, mask or cache entry moves logits by 0.1 to 10, far above it.
    """
    u = torch.finfo(dtype).eps / 2
    K = max(spec.d_model, spec.d_ff, spec.H_q * spec.d_head)
    return u * math.sqrt(K) * spec.L * magnitude


def _logits_tolerance(engine: Engine, *logits: torch.Tensor) -> float:
    return rounding_tolerance(max(float(t.abs().max()) for t in logits), engine.spec, engine.dtype)


def _cache_tolerance(engine: Engine, cache, n: int) -> float:
    magnitude = max(
        max(float(cache.k(i)[:, :, :n].abs().max()), float(cache.v(i)[:, :, :n].abs().max()))
        for i in range(len(cache.pool.k))
    )
    return rounding_tolerance(magnitude, engine.spec, engine.dtype)


def top2_margin(logits: torch.Tensor) -> float:
    """The gap between the largest and second-largest logit of a row [vocab]: below the rounding tolerance, the
    greedy choice between the two is a coin toss of summation order, not a property of the engine."""
    top = torch.topk(logits.float(), 2).values
    return float(top[0] - top[1])


def greedy_agreement(ours: list[torch.Tensor], ref: list[torch.Tensor], tol: float) -> tuple[int, str]:
    """Compare two greedy decodes step by step (logits rows [vocab] of each step). Returns (unexplained token
    differences, detail). A token that differs where the reference's top-2 margin is below `tol` is a near-tie:
    reported with its margin, and the comparison of that sequence ends there (its continuations legitimately
    part). Any other difference counts."""
    for step, (a, b) in enumerate(zip(ours, ref, strict=False)):
        if int(a.argmax()) != int(b.argmax()):
            margin = top2_margin(b)
            if margin < tol:
                return 0, f"near-tie at step {step}: top-2 margin {margin:.2g} < {tol:.2g}, compared up to it"
            return 1, f"step {step}: tokens differ with top-2 margin {margin:.2g} >= {tol:.2g}"
    return 0, ""


def _max_cache_diff(a, b, n: int) -> float:
    """Largest |difference| of K and V of two SeqKV caches over the last positions below n that both still hold,
    in every layer (a windowed layer holds only its window's blocks)."""
    worst = 0.0
    for i in range(len(a.pool.k)):
        m = min(a.held_positions(i), b.held_positions(i), n)
        if m:
            for x, y in ((a.k(i), b.k(i)), (a.v(i), b.v(i))):  # [1, H_kv, held, d_head]
                worst = max(worst, float((x[:, :, -m:] - y[:, :, -m:]).abs().max()))
    return worst


@torch.inference_mode()
def parallel_vs_sequential(engine: Engine, ids: list[int], tol: float | None = None) -> list[Check]:
    """One parallel prefill vs feeding the same tokens one at a time through the decode path. Tolerance:
    `rounding_tolerance` of the values compared, unless given."""
    P = len(ids)
    logits_par, par = engine.prefill(ids)  # [1, vocab]; cache [1, H_kv, P, d_head] per layer
    seq = engine.new_cache(P)
    for token in ids:
        logits_seq = engine.decode_step(torch.tensor([token]), seq)  # [1, vocab]
    return [
        Check(
            "last-position logits: parallel vs sequential",
            float((logits_par - logits_seq).abs().max()),
            tol or _logits_tolerance(engine, logits_par),
        ),
        Check(
            f"K and V of all {engine.spec.L} layers: parallel vs sequential",
            _max_cache_diff(par, seq, P),
            tol or _cache_tolerance(engine, par, P),
        ),
    ]


@torch.inference_mode()
def chunked_vs_single(engine: Engine, ids: list[int], chunk_size: int, tol: float | None = None) -> list[Check]:
    """Chunked prefill (chunks of `chunk_size` against the growing cache) vs one pass. Tolerance:
    `rounding_tolerance` of the values compared, unless given."""
    logits_one, one = engine.prefill(ids)
    logits_chunked, chunked = engine.prefill(ids, chunk_size=chunk_size)
    return [
        Check(
            f"logits: chunks of {chunk_size} vs one pass",
            float((logits_one - logits_chunked).abs().max()),
            tol or _logits_tolerance(engine, logits_one),
        ),
        Check(
            f"K and V: chunks of {chunk_size} vs one pass",
            _max_cache_diff(one, chunked, len(ids)),
            tol or _cache_tolerance(engine, one, len(ids)),
        ),
    ]


def kv_bytes_match_formula(engine: Engine, P: int, kv_dtype: str | None = None) -> Check:
    """The bytes the cache holds for P tokens against the formula: 2 * L * B * H_kv * P * d_head * b without
    windows; a windowed layer holds its window's blocks only (costs.kv_cache_bytes_held). K/V stored as
    `kv_dtype` (None: as the engine's pools store them), b its bytes per value (costs.kv_bytes_per_element)."""
    kv = engine.kv_dtype_name if kv_dtype is None else costs.kv_dtype_name(kv_dtype)
    pool = engine.new_pool(P, kv)
    _, cache = engine.prefill(list(range(1, P + 1)), pool.new_seq())
    expected = costs.kv_cache_bytes_held(engine.spec, P, costs.kv_bytes_per_element(kv), cache.pool.block_size)
    return Check(
        f"KV-cache bytes held vs formula ({kv} K/V)",
        abs(cache.nbytes() - expected),
        0,
        f"{cache.nbytes():,} vs {expected:,} B",
    )


def load_reference(source: str, dtype: torch.dtype = torch.float32):
    """The same weights in Hugging Face transformers (a .gguf file needs `accelerate` installed)."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    from prefill.costmodel.gguf_file import quick_gguf_parsing

    logging.set_verbosity_error()  # its deprecation notices are not ours to show
    path = Path(source)
    if path.suffix == ".gguf":
        with quick_gguf_parsing():
            model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    return model.eval()


@torch.inference_mode()
def parity_with_reference(engine: Engine, reference, ids: list[int], new_tokens: int = 8, tol: float | None = None):
    """Last-position logits and K/V against the reference, and the greedy continuation, token for token (near-ties
    aside, as in `greedy_agreement`). Tolerance: `rounding_tolerance` of the values compared, unless given."""
    x = torch.tensor([ids])
    out = reference(x, use_cache=True)
    ref_logits = out.logits[:, -1].float()  # [1, vocab]
    ours, cache = engine.prefill(ids)
    layers = out.past_key_values.layers if hasattr(out.past_key_values, "layers") else None
    logits_tol = tol or _logits_tolerance(engine, ref_logits)
    checks = [Check("last-position logits vs transformers", float((ours - ref_logits).abs().max()), logits_tol)]
    if layers is not None:
        # A windowed layer keeps only the positions its window may still see: compare those.
        n = [min(lay.keys.shape[2], cache.held_positions(i)) for i, lay in enumerate(layers)]
        kv = max(
            max(
                float((cache.k(i)[:, :, -m:] - lay.keys[:, :, -m:]).abs().max()),
                float((cache.v(i)[:, :, -m:] - lay.values[:, :, -m:]).abs().max()),
            )
            for i, (lay, m) in enumerate(zip(layers, n, strict=True))
        )
        checks.append(
            Check(
                "K and V of every layer (a windowed one's window) vs transformers",
                kv,
                tol or _cache_tolerance(engine, cache, len(ids)),
            )
        )
    # Greedy continuation, EOS not special: the reference recomputes the whole sequence each step.
    seq, ref_rows = x, []
    for _ in range(new_tokens):
        ref_rows.append(reference(seq).logits[0, -1].float())  # [vocab]
        seq = torch.cat([seq, ref_rows[-1].argmax().reshape(1, 1)], dim=1)
    logits, cache = engine.prefill(ids, engine.new_cache(len(ids) + new_tokens))
    our_rows = []
    for _ in range(new_tokens):
        our_rows.append(logits[0])
        logits = engine.decode_step(logits.argmax(-1), cache)
    differ, note = greedy_agreement(our_rows, ref_rows, logits_tol)
    checks.append(
        Check(f"greedy continuation of {new_tokens} tokens: tokens that differ (near-ties aside)", differ, 0, note)
    )
    return checks


@torch.inference_mode()
def batched_vs_alone(
    engine: Engine, prompts: list[list[int]], new_tokens: int = 8, tol: float | None = None
) -> list[Check]:
    """B prompts of different lengths decoded together (one forward per step, each row at its own position) vs
    each decoded alone. The batched GEMMs sum in another order than the lone ones (another M), so the logits
    agree within `rounding_tolerance` of their magnitude (unless `tol` is given), and the greedy tokens agree
    except where the lone run's top-2 margin is below that tolerance (a near-tie; reported, and that row is
    compared up to it)."""

    def alone(ids: list[int]) -> list[torch.Tensor]:
        logits, cache = engine.prefill(ids, engine.new_cache(len(ids) + new_tokens))
        rows = []
        for _ in range(new_tokens):
            rows.append(logits[0])
            logits = engine.decode_step(logits.argmax(-1), cache)
        return rows

    pool = engine.new_pool(sum(len(p) + new_tokens + 16 for p in prompts))
    seqs = [pool.new_seq() for _ in prompts]
    last = torch.stack([engine.prefill(p, s)[0][0] for p, s in zip(prompts, seqs, strict=True)])  # [B, vocab]
    rows: list[list[torch.Tensor]] = [[] for _ in prompts]
    for _ in range(new_tokens):
        for b in range(len(prompts)):
            rows[b].append(last[b])
        last = engine.decode_step(last.argmax(-1), seqs)  # one forward, B rows
    ref = [alone(p) for p in prompts]
    tol = tol or _logits_tolerance(engine, *[r for rr in ref for r in rr])
    differ, notes, diff = 0, [], 0.0
    for b, (ours, theirs) in enumerate(zip(rows, ref, strict=True)):
        n, note = greedy_agreement(ours, theirs, tol)
        differ += n
        if note:
            notes.append(f"row {b}: {note}")
        pairs = list(zip(ours, theirs, strict=True))
        upto = next((i for i, (x, y) in enumerate(pairs) if int(x.argmax()) != int(y.argmax())), len(pairs) - 1)
        for x, y in pairs[: upto + 1]:  # the same inputs up to the first token that differs
            diff = max(diff, float((x - y).abs().max()))
    B, lengths = len(prompts), ", ".join(str(len(p)) for p in prompts)
    return [
        Check(
            f"batched decode (B = {B}, P = {lengths}) vs alone: tokens that differ over {new_tokens} steps "
            "(near-ties aside)",
            differ,
            0,
            "; ".join(notes),
        ),
        Check(
            f"batched decode (B = {B}) vs alone: logits over {new_tokens} steps",
            diff,
            tol,
            f"tolerance = u * sqrt(K) * L * max|logits| ({engine.dtype})",
        ),
    ]


@torch.inference_mode()
def batch_invariance(engine: Engine, prompts: list[list[int]], new_tokens: int = 4, chunks=(16, 64)) -> list[Check]:
    """The batch-invariant mode's promise, bitwise (tolerance 0): each prompt's logits after its prefill and at
    every decode step are the same alone, decoded in batches of 1 .. B rows, and prefilled in chunks."""

    def decode(batch: list[list[int]]) -> list[list[torch.Tensor]]:
        pool = engine.new_pool(sum(len(p) + new_tokens + 16 for p in batch))
        seqs = [pool.new_seq() for _ in batch]
        last = torch.stack([engine.prefill(p, s)[0][0] for p, s in zip(batch, seqs, strict=True)])  # [B, vocab]
        rows = [[] for _ in batch]
        for _ in range(new_tokens):
            for b in range(len(batch)):
                rows[b].append(last[b])
            last = engine.decode_step(last.argmax(-1), seqs)
        return rows

    alone = [decode([p])[0] for p in prompts]
    worst = 0.0
    for B in range(2, len(prompts) + 1):
        for rows, ref in zip(decode(prompts[:B]), alone, strict=False):
            worst = max(worst, max(float((a - b).abs().max()) for a, b in zip(rows, ref, strict=True)))
    chunked = 0.0
    for p, ref in zip(prompts, alone, strict=True):
        for c in chunks:
            chunked = max(chunked, float((engine.prefill(p, chunk_size=c)[0][0] - ref[0]).abs().max()))
    return [
        Check(f"batch-invariant: decode in batches of 1..{len(prompts)} vs alone (bitwise)", worst, 0.0),
        Check(
            f"batch-invariant: prefill in chunks of {', '.join(map(str, chunks))} vs one pass (bitwise)", chunked, 0.0
        ),
    ]
