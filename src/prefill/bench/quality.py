"""The quality rule: how far each reduced-precision path's next-token distributions lie from the float32-activation
reference on the same model file, measured as llama.cpp's `llama-perplexity --kl-divergence` does, with
llama.cpp's own logits on the same file (in a child process) in the same table.

The text is cut into windows of `window` tokens, each from an empty cache; the second half of each window is
scored (every scored token has at least window / 2 tokens of context), as llama-perplexity scores its chunks.
At every scored position, with p the reference's distribution and q the path's:

    KL(p || q) = sum_v p_v (log p_v - log q_v)            mean and 99th percentile over the positions (nats)
    top-1 agreement = share of positions where argmax q == argmax p
    perplexity ratio = exp(mean NLL under q) / exp(mean NLL under p), NLL of the text's own next token

The gate (issue 51; prefill.machine.quality_gate): a path is near-lossless where top-1 >= 99%, |PPL ratio - 1|
<= 0.002 and p99 KL <= 0.01 on at least 10,000 tokens; run_quality caches each path's figures per model file,
and `auto` weighs a reduced-precision path only where they pass. Beside it, a comparison (issue 42), not the
gate: ours no worse than llama.cpp's on every measure, where "worse" is a difference the text can tell apart
from its own sampling noise: the paired difference (ours less llama.cpp's, on the same positions)
exceeds Z_WORSE standard errors, the error bootstrapped over the windows (independent runs of the text, each from
an empty cache), as llama-perplexity prints its own figures with "±". One window (no spread to measure) compares
the figures as they are. The held-out text: the Python Language Reference's help topics as CPython ships them
(pydoc_data/topics.py), never the seed prompts.

    held_out_ids(tokenizer, n)            n tokens of the held-out text
    measure_quality(reference, paths, ids, window)   -> [QualityRow], each with its per-window scores
    Limits.of(row) / Limits.check(row)    fixed bounds (a path against float32's roundoff), and what breaks them
    worse_than(row, bound)                the measures where `row` is worse than `bound`'s row beyond the noise
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from prefill.errors import BadInput

TEXT_SOURCE = "the Python Language Reference's help topics, as CPython ships them (pydoc_data/topics.py)"
QUALITY_TOKENS = 10_240  # the rule: a held-out text of at least 10,000 tokens
WINDOW = 512  # tokens per window; its second half is scored
LLAMA = "llama.cpp"  # its row's name begins so
Z_WORSE = 2.0  # standard errors a paired difference must exceed to count as worse (one-sided, about 2.3% each)
RESAMPLES = 1000  # bootstrap resamples of the windows (a fixed seed: the verdict is a function of the scores)

Logits = Callable[[list[int], int, int], torch.Tensor]  # (window ids [T], lo, hi) -> logits [hi - lo, vocab] of
# positions lo .. hi-1, the window run from an empty cache


def held_out_ids(tokenizer, n: int) -> list[int]:
    """The first `n` tokens of TEXT_SOURCE (its topics in sorted order), or BadInput when it has fewer."""
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    ids = tokenizer.encode(text)
    if len(ids) < n:
        raise BadInput(f"the held-out text has {len(ids):,} tokens, fewer than the {n:,} asked for")
    return ids[:n]


@dataclass(frozen=True)
class Scores:
    """One path's per-position scores, window by window (each tensor [windows, n], n scored positions a
    window): KL from the reference (nats), agreement on the top token (0 or 1), the text's next-token NLL under
    the path and under the reference (nats)."""

    kl: torch.Tensor
    agree: torch.Tensor
    nll: torch.Tensor
    ref_nll: torch.Tensor

    def measures(self, w: torch.Tensor) -> torch.Tensor:
        """[mean KL, p99 KL, top-1, perplexity ratio] over the windows `w` ([W'] indices, repeats allowed: [4];
        or [R, W'], R resamples at once: [R, 4])."""
        kl = self.kl.double()[w].flatten(-2)  # [..., W' * n]
        ratio = torch.exp(self.nll.double()[w].mean((-2, -1)) - self.ref_nll.double()[w].mean((-2, -1)))
        return torch.stack(
            [kl.mean(-1), torch.quantile(kl, 0.99, dim=-1), self.agree.double()[w].mean((-2, -1)), ratio], -1
        )


@dataclass(frozen=True)
class QualityRow:
    """One path against the reference: mean and 99th-percentile KL (nats), top-1 agreement (0..1), its
    perplexity and the reference's, over `positions` scored tokens; `scores`: the per-window scores they come
    from (None for a row made up by hand)."""

    path: str
    mean_kl: float
    p99_kl: float
    top1: float
    ppl: float
    ref_ppl: float
    positions: int
    scores: Scores | None = field(default=None, compare=False, repr=False)

    @property
    def ppl_ratio(self) -> float:
        return self.ppl / self.ref_ppl


def measure_quality(reference: Logits, paths: dict[str, Logits], ids: list[int], window: int = WINDOW):
    """[QualityRow] of every path in `paths` (name -> logits function) against `reference` over `ids`, cut in
    windows of `window` tokens whose second halves are scored."""
    if window < 4 or len(ids) < window:
        raise BadInput(f"quality needs a window of at least 4 tokens and a text at least that long ({len(ids)})")
    per: dict[str, dict[str, list[torch.Tensor]]] = {name: {"kl": [], "agree": [], "nll": []} for name in paths}
    ref_nll: list[torch.Tensor] = []
    for start in range(0, len(ids) - window + 1, window):
        chunk = ids[start : start + window]
        half = window // 2
        target = torch.tensor(chunk[half:], dtype=torch.long)[:, None]  # [n, 1]: what positions half-1 .. T-2 predict
        p_log = torch.log_softmax(reference(chunk, half - 1, window - 1).float(), -1)  # [n, vocab]
        ref_nll.append(-p_log.gather(1, target)[:, 0])  # [n]
        for name, fn in paths.items():
            q_log = torch.log_softmax(torch.as_tensor(fn(chunk, half - 1, window - 1)).float(), -1)  # [n, vocab]
            s = per[name]
            s["kl"].append((p_log.exp() * (p_log - q_log)).sum(-1).clamp_min(0))  # [n]
            s["agree"].append((q_log.argmax(-1) == p_log.argmax(-1)).float())  # [n]
            s["nll"].append(-q_log.gather(1, target)[:, 0])  # [n]
    ref = torch.stack(ref_nll)  # [windows, n]
    return [_row(name, Scores(*(torch.stack(s[k]) for k in ("kl", "agree", "nll")), ref)) for name, s in per.items()]


def _row(name: str, s: Scores) -> QualityRow:
    mean_kl, p99, top1, _ = s.measures(torch.arange(len(s.kl))).tolist()
    ppl, ref_ppl = math.exp(float(s.nll.double().mean())), math.exp(float(s.ref_nll.double().mean()))
    return QualityRow(name, mean_kl, p99, top1, ppl, ref_ppl, s.kl.numel(), s)


@dataclass(frozen=True)
class Limits:
    """The rule's bounds on one row: mean and p99 KL at most, top-1 agreement at least, and the perplexity
    ratio's distance from 1 at most."""

    mean_kl: float
    p99_kl: float
    top1: float
    ppl_drift: float

    @classmethod
    def of(cls, row: QualityRow) -> Limits:
        """The bounds a row sets (llama.cpp's own, in the issue's rule: ours is no worse on every measure)."""
        return cls(row.mean_kl, row.p99_kl, row.top1, abs(row.ppl_ratio - 1))

    def check(self, row: QualityRow) -> list[str]:
        """The measures of `row` that break these bounds, in words (empty: it passes)."""
        broken = []
        if row.mean_kl > self.mean_kl:
            broken.append(f"mean KL {row.mean_kl:.2e} > {self.mean_kl:.2e}")
        if row.p99_kl > self.p99_kl:
            broken.append(f"p99 KL {row.p99_kl:.2e} > {self.p99_kl:.2e}")
        if row.top1 < self.top1:
            broken.append(f"top-1 {row.top1:.2%} < {self.top1:.2%}")
        if abs(row.ppl_ratio - 1) > self.ppl_drift:
            broken.append(f"perplexity ratio {row.ppl_ratio:.4f} drifts more than {self.ppl_drift:.4f} from 1")
        return broken


MEASURES = ("mean KL", "p99 KL", "top-1", "perplexity drift")


def _worse_by(m: torch.Tensor, bound: torch.Tensor) -> torch.Tensor:
    """How much worse measures `m` are than `bound`'s ([..., 4] from Scores.measures), each signed so that
    positive is worse: more KL, less top-1 agreement, a perplexity ratio farther from 1 [..., 4]."""
    d = m - bound
    d[..., 2] = -d[..., 2]
    d[..., 3] = (m[..., 3] - 1).abs() - (bound[..., 3] - 1).abs()
    return d


def worse_than(row: QualityRow, bound: QualityRow, z: float = Z_WORSE, resamples: int = RESAMPLES) -> list[str]:
    """The measures on which `row` is worse than `bound` (both measured on the same windows) by more than `z`
    standard errors of their paired difference, bootstrapped over the windows, in words (empty: no worse).
    With one window, or a row without its scores, the figures are compared as they are (Limits)."""
    a, b = row.scores, bound.scores
    if a is None or b is None or len(a.kl) < 2:
        return Limits.of(bound).check(row)
    if a.kl.shape != b.kl.shape:
        raise ValueError(f"rows scored on different windows: {tuple(a.kl.shape)} and {tuple(b.kl.shape)}")
    every = torch.arange(len(a.kl))
    observed = _worse_by(a.measures(every), b.measures(every))  # [4]
    g = torch.Generator().manual_seed(0)
    draws = torch.randint(len(a.kl), (resamples, len(a.kl)), generator=g)  # [resamples, windows]
    boot = _worse_by(a.measures(draws), b.measures(draws))  # [resamples, 4]
    se = boot.std(0)  # [4]
    return [
        f"{name} worse by {d:.3g} (±{e:.2g}, {d / e if e > 0 else math.inf:.1f} standard errors)"
        for name, d, e in zip(MEASURES, observed.tolist(), se.tolist(), strict=True)
        if d > z * e
    ]


def engine_logits(engine, kv_dtype: str | None = None) -> Logits:
    """A Logits function of an engine: one forward of the window from an empty cache (every position unembedded),
    K/V stored as `kv_dtype` (None: as the engine's pools store them) and read back as stored."""

    def logits(ids: list[int], lo: int, hi: int) -> torch.Tensor:
        pool = engine.new_pool(len(ids) + 1, kv_dtype)
        seq = pool.new_seq()
        try:
            with torch.inference_mode():
                out = engine.forward(torch.tensor([ids]), [seq], output="all")  # [1, T, vocab]
            return out[0, lo:hi]  # [hi - lo, vocab]
        finally:
            seq.free()

    return logits


def quality_table(rows: list[QualityRow], reference: str, bound: QualityRow | None, title: str):
    """A rich Table of the rows: each one's figures, whether it is near-lossless (the gate: `auto` may weigh it),
    and whether it is worse than `bound` (llama.cpp's row, when given) beyond the noise."""
    from rich.table import Table

    from prefill.machine.quality_gate import GATE, QualityRecord

    t = Table(title=title, title_justify="left")
    t.caption = (
        f"against {reference}; KL in nats over the scored positions; near-lossless (auto may weigh it): top-1 >= "
        f"{GATE.top1:.0%}, |PPL ratio - 1| <= {GATE.ppl_drift:g}, p99 KL <= {GATE.p99_kl:g} on >= "
        f"{GATE.min_tokens:,} tokens; vs llama.cpp: worse means by more than {Z_WORSE:g} standard errors of the "
        "paired difference (bootstrapped over the windows)"
    )
    for col in ("path", "mean KL", "p99 KL", "top-1", "PPL", "PPL ratio", "positions", "near-lossless", "vs llama.cpp"):
        t.add_column(col, justify="left" if col == "path" else "right")
    for r in rows:
        record = QualityRecord(r.top1, r.ppl_ratio, r.mean_kl, r.p99_kl, 2 * r.positions)  # half of each window scored
        gate = "; ".join(record.failures())
        broken = worse_than(r, bound) if bound is not None and not r.path.startswith(LLAMA) else []
        versus = "-" if bound is None else ("worse: " + "; ".join(broken) if broken else "no worse")
        t.add_row(
            r.path,
            f"{r.mean_kl:.2e}",
            f"{r.p99_kl:.2e}",
            f"{r.top1:.2%}",
            f"{r.ppl:.3f}",
            f"{r.ppl_ratio:.4f}",
            f"{r.positions:,}",
            f"[red]no[/]: {gate}" if gate else "[green]yes[/]",
            "the peer" if r.path.startswith(LLAMA) else versus,
        )
    return t


@dataclass
class QualityReport:
    """Every path's row, llama.cpp's (None when it could not run: `notes` say why), and what was measured."""

    reference: str
    rows: list[QualityRow]
    llama: QualityRow | None
    tokens: int
    window: int
    notes: list[str] = field(default_factory=list)

    def failures(self) -> dict[str, list[str]]:
        """Path -> the measures where it is worse than llama.cpp beyond the noise (empty without its row)."""
        bound = self.llama
        return {} if bound is None else {r.path: b for r in self.rows if (b := worse_than(r, bound))}


def llama_scorer(path: str, window: int, threads: int | None, notes: list[str]):
    """llama.cpp scoring `path` in a child process (a PeerProcess whose "logits" call gives a window's logits), or
    None with the reason in `notes` (not a .gguf file, llama-cpp-python missing, or its crash)."""
    from prefill.bench.peer_process import PeerCrashed, PeerFailed, PeerProcess
    from prefill.bench.peers import llamacpp_available, load_llamacpp_scorer

    if not (path.endswith(".gguf") and llamacpp_available()):
        notes.append(
            "llama.cpp row left out: it needs a .gguf file and llama-cpp-python (pip install 'prefill[llamacpp]')"
        )
        return None
    args = {"path": path, "n_ctx": window, "threads": threads or torch.get_num_threads()}
    try:
        return PeerProcess(load_llamacpp_scorer, args, "llamacpp", "gguf")
    except (PeerCrashed, PeerFailed) as e:
        notes.append(f"llama.cpp could not run: {e}")
        return None


def run_quality(model: str | None, tokens: int = QUALITY_TOKENS, window: int = WINDOW, threads: int | None = None):
    """The QualityReport of `model` (default: the embedded GGUF): every path open on this CPU against the
    float32-activation reference (native blocks where the file has them, else dense float32, float32 K/V), the
    reference with K/V stored at fewer bytes, the other float32 paths with the K/V --kv-dtype auto may store, and
    llama.cpp's logits of the same file from a child process. Each path's figures are cached for the quality
    gate (prefill.machine.quality_gate.save_records: `auto` reads them)."""
    from prefill.costmodel.costs import KV_DTYPES
    from prefill.device.capability import capability
    from prefill.engine.llm import Engine
    from prefill.engine.weights import quantized_types
    from prefill.loading import default_model_path
    from prefill.machine.paths import KV_AUTO, candidates
    from prefill.machine.quality_gate import QualityRecord, save_records
    from prefill.model.quant import ops

    if threads is not None:
        torch.set_num_threads(threads)
    path = str(default_model_path() if model is None else model)
    open_paths = candidates("auto", "auto", quantized_types(path), capability("cpu"), ops.available())
    ref_path = next(p for p in open_paths if p.dtype == "float32")  # native blocks first, in the registry
    engines = {
        p: Engine.load(path, dtype=p.dtype, weights=p.weights, progress=False, activations=p.activations)
        for p in open_paths
    }
    ref = engines.pop(ref_path)
    ids = held_out_ids(ref.tokenizer, tokens)
    label = lambda p, e: f"{p.label(())} ({e.weights})" if p.weights == "native" else p.label()  # noqa: E731
    paths = {label(p, e): engine_logits(e) for p, e in engines.items()}
    keys = {label(p, e): p.key() for p, e in engines.items()}  # row -> the gate's name of its path
    for kv in KV_DTYPES[1:]:  # the reference path with K/V stored at fewer bytes (--kv-dtype)
        paths[f"{label(ref_path, ref)}, {kv} K/V"] = engine_logits(ref, kv)
        keys[f"{label(ref_path, ref)}, {kv} K/V"] = ref_path.key(kv)
    for p, e in engines.items():  # and every other float32 path with what --kv-dtype auto may store
        for kv in KV_AUTO[1:] if p.dtype == "float32" else ():
            paths[f"{label(p, e)}, {kv} K/V"] = engine_logits(e, kv)
            keys[f"{label(p, e)}, {kv} K/V"] = p.key(kv)
    notes: list[str] = []
    llama = llama_scorer(path, window, threads, notes)
    if llama is not None:
        paths[f"{LLAMA} {llama.version} (its own kernels)"] = lambda w, lo, hi: llama.call("logits", w, lo, hi)
    try:
        rows = measure_quality(engine_logits(ref), paths, ids, window)
    finally:
        if llama is not None:
            llama.close()
    ours = [r for r in rows if not r.path.startswith(LLAMA)]
    theirs = next((r for r in rows if r.path.startswith(LLAMA)), None)
    cpu = capability("cpu").kind
    gate = {keys[r.path]: QualityRecord(r.top1, r.ppl_ratio, r.mean_kl, r.p99_kl, len(ids), cpu) for r in ours}
    save_records(path, gate)
    return QualityReport(label(ref_path, ref), ours, theirs, len(ids), window, notes)
