"""This device's MachineProfile for a model: probed on first need (a few seconds, said in one line), cached on disk
per machine, torch version, thread count and dtype, and replaced by a fitted one once a benchmark has fitted it.

    model_shapes(spec)                    the (K, N) of every GEMM the model runs (gemm_shapes: all five, in order)
    profile_for(spec, dtype, device)      the fitted profile if one is saved, else the quick probe's
    probe_profile(spec, dtype, device)    the quick probe's: from this process, the disk cache, or measured now
    probe_age_s(entry)                    how long ago a cached probe was measured (a server probes again past an age)
    measure_entry(spec, dtype, device)    one fresh probe's measurements, not cached (a benchmark runs several)
    profile_of(entry, spec, dtype)        the profile of an entry (one probe's, or entries.median_entry of several)
    gemm_rates(device, shape, dtypes)     FLOP/s per dtype at one shape (what --dtype auto reads)
    this_cpu()                            this machine as a Hardware entry (the calculator's `--hardware cpu`)
    get_hardware(name)                    a catalog entry, or "cpu": this machine, measured once per process
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

from prefill.costmodel import hardware
from prefill.costmodel.costs import cache_dtype, canonical_dtype
from prefill.costmodel.hardware import Hardware
from prefill.costmodel.profile import GemmCurve, MachineProfile, shape_key
from prefill.costmodel.specs import ModelSpec
from prefill.device.cache import read_json, write_json
from prefill.machine import attention_probe, elementwise, probe
from prefill.machine.entries import current, curve_points, entry_key, stamp, undisturbed
from prefill.machine.fits import with_fit

PROFILE_FILE = "machine.json"  # the probe's measurements, per machine key and dtype
# The embedded SmolLM2-135M's widest projection: [P, d_model=576] x [576, 2 d_ff=3072] (gate and up in one GEMM).
DEFAULT_SHAPE = (576, 3072)
PROBE_M = 512  # the row count --dtype auto compares dtypes at (P = 512 is where the speed targets are set)


def gemm_shapes(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """(K, N) of the model's five GEMMs in order: fused Q/K/V, output, fused gate/up, down, unembedding."""
    d, dh = spec.d_model, spec.d_head
    return (
        (d, (spec.H_q + 2 * spec.H_kv) * dh),
        (spec.H_q * dh, d),
        (d, 2 * spec.d_ff),
        (spec.d_ff, d),
        (d, spec.vocab_size),
    )


def model_shapes(spec: ModelSpec) -> tuple[tuple[int, int], ...]:
    """gemm_shapes, each once."""
    return tuple(dict.fromkeys(gemm_shapes(spec)))


class _Threads:
    """Run the probe with `n` CPU threads (the engine's), restoring torch's setting after."""

    def __init__(self, n: int | None) -> None:
        self.n = n

    def __enter__(self) -> None:
        import torch

        self.old = torch.get_num_threads()
        if self.n is not None:
            torch.set_num_threads(self.n)

    def __exit__(self, *exc) -> None:
        import torch

        torch.set_num_threads(self.old)


def _heads(spec: ModelSpec, dtype: str, kv_dtype: str | None = None) -> str:
    """The entry's name of the attention curves at the model's heads, with the K/V dtype where the pool stores
    K/V otherwise than the model computes (the decode curve reads them as stored)."""
    kv = cache_dtype(kv_dtype or dtype)
    return f"{spec.H_q}/{spec.H_kv}x{spec.d_head}" + ("" if kv == canonical_dtype(dtype) else f"|kv {kv}")


def _gemm_key(K: int, N: int, qtypes: dict[str, str]) -> str:
    """The entry's name of the GEMM curve at (K, N): "KxN" for dense weights, "KxN:Q4_1" for GGUF blocks."""
    qtype = qtypes.get(shape_key(K, N))
    return f"{shape_key(K, N)}:{qtype}" if qtype else shape_key(K, N)


def _measure_missing(
    entry: dict, spec: ModelSpec | None, shapes, dtype: str, device: str, qtypes=None, kv_dtype: str | None = None
) -> bool:
    """Measure what `entry` lacks for these shapes (and, with a spec, its attention over K/V stored as
    `kv_dtype` and the memory system); True if anything was measured. `qtypes`: "KxN" -> the GGUF type of
    weights kept as blocks at that shape."""
    curves, measured, qtypes = entry.setdefault("gemm", {}), False, qtypes or {}
    if "bandwidth_bytes_per_s" not in entry:  # first: a CPU's GEMM curve adds the weights' streaming time
        entry["bandwidth_bytes_per_s"], measured = probe.measure_bandwidth(device), True
    for K, N in shapes:
        if (name := _gemm_key(K, N, qtypes)) not in curves:
            qtype, bandwidth = qtypes.get(shape_key(K, N)), entry.get("bandwidth_bytes_per_s")
            curve = probe.gemm_curve(K, N, dtype, device, qtype=qtype, bandwidth=bandwidth)
            curves[name], measured = [list(p) for p in curve], True
    if spec is None:
        return measured
    attention = entry.setdefault("attention", {})
    if (base := _heads(spec, dtype)) not in attention:
        curves = attention_probe.attention_curves(spec.H_q, spec.H_kv, spec.d_head, dtype, device)
        attention[base] = {"prefill": [list(p) for p in curves[0]], "decode": [list(p) for p in curves[1]]}
        measured = True
    if (heads := _heads(spec, dtype, kv_dtype)) not in attention:  # K/V stored otherwise: a decode curve over them
        _, decode = attention_probe.attention_curves(
            spec.H_q, spec.H_kv, spec.d_head, dtype, device, kv_dtype=kv_dtype, prefill=False
        )  # a prefill's attention is the compute dtype's (its keys as computed)
        attention[heads] = {"prefill": attention[base]["prefill"], "decode": [list(p) for p in decode]}
        measured = True
    if "op_overhead_s" not in entry:
        cpu = not device.startswith("cuda")
        entry["op_overhead_s"] = probe.measure_op_overhead(device, dtype=dtype)
        entry["cache_bytes"] = probe.last_level_cache_bytes() if cpu else 0
        rate = elementwise.measure_elementwise_rate(spec, dtype, device) if cpu else None
        entry["cache_bandwidth_bytes_per_s"] = rate  # the elementwise work's rate, within the cache
        measured = True
    return measured


def _store(key: str, entry: dict, merge: bool = True) -> None:
    """Merge `entry` into the disk cache under `key` (another process may have written meanwhile), or replace
    what is there (a stale probe: its other shapes are as old as the rest, measured again on their next need)."""
    entry["measured"] = time.strftime("%Y-%m-%d %H:%M:%S")
    entry |= stamp()
    data = read_json(PROFILE_FILE)
    old = _valid(data.get(key, {})) if merge else {}
    merged = {**old, **entry}
    for part in ("gemm", "attention"):
        merged[part] = {**old.get(part, {}), **entry.get(part, {})}
    data[key] = merged
    write_json(PROFILE_FILE, data)


_MEMO: dict[str, MachineProfile] = {}  # once per process


def probe_profile(
    spec: ModelSpec,
    dtype: str,
    device: str = "cpu",
    threads: int | None = None,
    refresh: bool = False,
    echo: Callable[[str], None] | None = None,
    qtypes: dict[str, str] | None = None,
    max_age_s: float | None = None,
    kv_dtype: str | None = None,
) -> MachineProfile:
    """The quick probe's profile for `spec` in `dtype`: from this process, the disk cache, or measured now (a
    few seconds; `echo` gets a one-line note first). `refresh` measures everything again, and so does a cached
    probe older than `max_age_s` (this machine's speed drifts over minutes: a server probes again at its start,
    so that its predictions describe the minutes it serves in). `qtypes`: "KxN" -> the GGUF type of the weights
    an engine keeps as blocks at that shape (their GEMMs are timed on those kernels); `kv_dtype`: what its pool
    stores K/V as (None: `dtype`; decode attention is timed reading them so)."""
    dtype, shapes, qtypes = canonical_dtype(dtype), model_shapes(spec), qtypes or {}
    key = entry_key(device, threads, dtype)
    memo = f"{key}|{spec.name}|{shapes}|{sorted(qtypes.items())}|{_heads(spec, dtype, kv_dtype)}"
    if not refresh and max_age_s is None and memo in _MEMO:
        return _MEMO[memo]
    entry = {} if refresh else _valid(read_json(PROFILE_FILE).get(key, {}))
    age = probe_age_s(entry)
    has = functools.partial(_has, spec=spec, shapes=shapes, qtypes=qtypes, heads=_heads(spec, dtype, kv_dtype))
    stale = max_age_s is not None and age is not None and age > max_age_s and has(entry)
    if stale and echo is not None:
        echo(
            f"this machine's cached probe is {_age_text(age)} old: probing it again (a few seconds), so that "
            "predictions describe the minutes it runs in"
        )
    entry = {} if stale else entry
    with _Threads(threads):
        if echo is not None and not stale and not has(entry):
            echo(
                f"probing this machine for {spec.name} in {dtype}: GEMM rates at its shapes, attention, bandwidth, "
                "overhead (a few seconds, once; `prefill calibrate` measures again)"
            )
        measure = functools.partial(
            _measure_missing, spec=spec, shapes=shapes, dtype=dtype, device=device, qtypes=qtypes, kv_dtype=kv_dtype
        )
        if measure(entry):
            entry = undisturbed(entry, measure, echo)
            _store(key, entry, merge=not stale)
        n_threads = None if device.startswith("cuda") else _torch_threads()
    profile = _build(entry, spec, shapes, dtype, device, n_threads, qtypes, kv_dtype)
    _MEMO[memo] = profile
    return profile


def probe_age_s(entry: dict) -> float | None:
    """Seconds since a cached probe `entry` was measured (its local-time stamp), or None without one."""
    try:
        return time.time() - time.mktime(time.strptime(entry["measured"], "%Y-%m-%d %H:%M:%S"))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def _age_text(seconds: float) -> str:
    minutes = round(seconds / 60)
    if minutes < 120:
        return f"{minutes} min"
    return f"{minutes / 60:.0f} h" if minutes < 2880 else f"{minutes / 1440:.0f} days"


def measure_entry(
    spec: ModelSpec,
    dtype: str,
    device: str = "cpu",
    threads: int | None = None,
    qtypes: dict[str, str] | None = None,
    kv_dtype: str | None = None,
) -> dict:
    """One fresh probe's measurements for `spec` (the quick probe's few seconds), not cached: a benchmark probes
    in every round of its own measurements, so the probe sees the same minutes of a drifting machine."""
    entry: dict = {}
    with _Threads(threads):
        _measure_missing(entry, spec, model_shapes(spec), canonical_dtype(dtype), device, qtypes or {}, kv_dtype)
    return entry


def profile_of(
    entry: dict,
    spec: ModelSpec,
    dtype: str,
    device: str = "cpu",
    qtypes: dict[str, str] | None = None,
    fitted: bool = False,
    threads: int | None = None,
    kv_dtype: str | None = None,
) -> MachineProfile:
    """The profile of a probe's `entry` (measure_entry's, or their median_entry) for `spec`, taken with `threads`
    (default: torch's), with the saved fit applied as profile_for applies it when `fitted`."""
    n_threads = None if device.startswith("cuda") else threads or _torch_threads()
    dtype = canonical_dtype(dtype)
    profile = _build(entry, spec, model_shapes(spec), dtype, device, n_threads, qtypes or {}, kv_dtype)
    return with_fit(profile, spec, device, threads, qtypes or {}) if fitted else profile


def save_probe(entry: dict, dtype: str, device: str = "cpu", threads: int | None = None) -> None:
    """Cache `entry` as this machine's quick probe for `dtype` (the next probe_profile in any process reads it)."""
    _MEMO.clear()
    _store(entry_key(device, threads, dtype), dict(entry))


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _valid(entry) -> dict:
    """The cached entry, or {} when it is not what this version writes (a cache is only a cache: measure again)."""
    if not isinstance(entry, dict) or not current(entry):
        return {}
    try:
        if not isinstance(entry.get("gemm", {}), dict) or not isinstance(entry.get("attention", {}), dict):
            return {}
        for rows in entry.get("gemm", {}).values():
            curve_points(rows)
        for curves in entry.get("attention", {}).values():
            curve_points(curves["prefill"]), curve_points(curves["decode"])
        return entry
    except (AttributeError, KeyError, TypeError, ValueError):
        return {}


def _has(entry: dict, spec: ModelSpec, shapes, qtypes: dict[str, str], heads: str) -> bool:
    return (
        all(_gemm_key(K, N, qtypes) in entry.get("gemm", {}) for K, N in shapes)
        and heads in entry.get("attention", {})
        and "op_overhead_s" in entry
    )


def _curve(entry: dict, K: int, N: int, qtypes: dict[str, str]) -> GemmCurve:
    return GemmCurve(K, N, curve_points(entry["gemm"][_gemm_key(K, N, qtypes)]))


def _build(
    entry: dict,
    spec: ModelSpec,
    shapes,
    dtype: str,
    device: str,
    threads: int | None,
    qtypes: dict[str, str],
    kv_dtype: str | None = None,
) -> MachineProfile:
    from prefill.device.capability import capability

    curves = tuple(_curve(entry, K, N, qtypes) for K, N in shapes)
    attention = entry["attention"][_heads(spec, dtype, kv_dtype)]
    cuda = device.startswith("cuda")
    return MachineProfile(
        name=f"{capability('cuda' if cuda else 'cpu').name} ({'GPU' if cuda else f'{threads} threads'}, {dtype})",
        dtype=dtype,
        peak_flops_per_s=max(r for c in curves for _, r in c.points),
        bandwidth_bytes_per_s=entry["bandwidth_bytes_per_s"],
        op_overhead_s=entry["op_overhead_s"],
        source=f"quick probe of {entry.get('measured', 'this machine')} at {spec.name}'s shapes",
        gemm=curves,
        attention=curve_points(attention["prefill"]),
        attention_decode=curve_points(attention["decode"]),
        cache_bytes=entry.get("cache_bytes", 0),
        cache_bandwidth_bytes_per_s=entry.get("cache_bandwidth_bytes_per_s"),
        overlap_launches=cuda,
        threads=threads,
    )


def profile_for(
    spec: ModelSpec,
    dtype: str,
    device: str = "cpu",
    threads: int | None = None,
    fitted: bool = True,
    echo: Callable[[str], None] | None = None,
    qtypes: dict[str, str] | None = None,
    max_age_s: float | None = None,
    kv_dtype: str | None = None,
) -> MachineProfile:
    """The profile predictions use: the quick probe's (`qtypes`, `max_age_s` and `kv_dtype` as probe_profile),
    with the parameters a benchmark fitted for this machine, dtype, model and weights applied when there are
    some (and `fitted`)."""
    profile = probe_profile(
        spec, dtype, device, threads, echo=echo, qtypes=qtypes, max_age_s=max_age_s, kv_dtype=kv_dtype
    )
    return with_fit(profile, spec, device, threads, qtypes or {}) if fitted else profile


def gemm_rates(
    device: str = "cpu",
    shape: tuple[int, int] = DEFAULT_SHAPE,
    dtypes: tuple[str, ...] = ("float32",),
    threads: int | None = None,
    refresh: bool = False,
) -> dict[str, float]:
    """FLOP/s per dtype of [PROBE_M, K] x [K, N] at shape (K, N), read off the probe's GEMM curve of that shape
    (measured now where the cache has none, or again for every dtype with `refresh`)."""
    K, N = shape
    rates = {}
    for dt in dict.fromkeys(canonical_dtype(d) for d in dtypes):
        key = entry_key(device, threads, dt)
        entry = read_json(PROFILE_FILE).get(key, {})
        if refresh:
            entry["gemm"] = {name: pts for name, pts in entry.get("gemm", {}).items() if name != shape_key(K, N)}
        with _Threads(threads):
            if _measure_missing(entry, None, [shape], dt, device):
                _store(key, {"gemm": {shape_key(K, N): entry["gemm"][shape_key(K, N)]}})
        rates[dt] = _curve(entry, K, N, {}).rate(PROBE_M)
    return rates


@functools.cache
def this_cpu() -> Hardware:
    """This machine: square GEMM rates measured now in float32 and bfloat16, the streaming bandwidth, RAM size."""
    import psutil

    return Hardware(
        name=f"this CPU ({os.cpu_count()} cores)",
        peak_flops={dt: probe.measure_gemm_rate(dt) for dt in ("float32", "bfloat16")},
        bandwidth_bytes_per_s=probe.measure_bandwidth(),
        memory_bytes=psutil.virtual_memory().total,
        source="measured on this machine: square GEMM (torch.matmul) and a streaming GEMV (prefill.machine.probe)",
    )


def get_hardware(name: str) -> Hardware:
    """A catalog entry by name or alias (prefill.costmodel.hardware), or "cpu": this machine, measured once per
    process."""
    return this_cpu() if name.lower() == "cpu" else hardware.get_hardware(name)
