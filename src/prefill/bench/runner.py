"""The sweep: every prompt length and dtype, our engine and its peers side by side, in one process and one run.

For each dtype the engines are loaded once; for each P they run the same token ids with their repeats
interleaved (ours, ours compiled, transformers, llama.cpp, ours, ...), so drifts and bursts of load hit all of
them alike. Each point: a cold call, warm-up, `repeats` timed calls, then one untimed call for peak memory.
The GEMM rate that MFU is measured against is taken in the same run. `prepare` decides the dtypes (native ones
by default, prefill.bench.sweep) and estimates the duration before anything is loaded.
"""

from __future__ import annotations

import gc
import os
import platform
from collections.abc import Callable
from dataclasses import replace

from prefill.bench import calibrate, sweep
from prefill.bench.contention import rate_again
from prefill.bench.peer_process import PeerRun
from prefill.bench.peers import (
    alive_peers,
    dense_dtypes,
    llamacpp_version,
    load_llamacpp_peers,
    load_transformers_peer,
    time_point,
    transformers_version,
)
from prefill.bench.results import (
    OURS,
    OURS_COMPILED,
    PROMPT_TEXT,
    VERDICT_P,
    BenchConfig,
    BenchResult,
    Measurement,
)
from prefill.bench.timing import PeakMemory, Timing, measure_peak_memory, time_call
from prefill.costmodel.costs import FlopCount, mfu, prefill_flops_exact
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput


def prepare(config: BenchConfig) -> tuple[BenchConfig, sweep.Plan, ModelSpec, str]:
    """Before loading anything: the model's path and spec, the dtypes (native ones for "auto") and lengths,
    and the estimated duration from the cost model at the probe's GEMM rates. Returns the config with
    concrete dtypes, the plan, the spec and the model path."""
    from prefill.costmodel.specs import load_spec
    from prefill.device.capability import capability
    from prefill.loading.resolve import model_path as checked_path
    from prefill.machine.profiles import gemm_rates

    model_path = str(checked_path(config.model))  # a .gguf file or a model folder, else a one-line error
    spec = load_spec(model_path)
    notes: list[str] = []
    lengths = _capped_lengths(config.prompt_lengths, spec, notes)
    cap = capability("cuda" if config.device.startswith("cuda") else "cpu")
    dtypes, per, dt_notes = sweep.dtypes_and_lengths(config.dtypes, lengths, cap, config.force)
    # A bench re-probes (and re-caches) the rates: it is the command a user runs to measure this machine anew.
    shape = (spec.d_model, 2 * spec.d_ff)
    rates = gemm_rates(config.device, shape=shape, dtypes=dtypes, threads=config.threads, refresh=True)
    dense = dense_dtypes(config, model_path)
    llama_files = {dt: (dt in dense) + (i == 0 and model_path.endswith(".gguf")) for i, dt in enumerate(dtypes)}
    runs = dict(
        repeats=config.repeats, warmup=config.warmup, chunk_sizes=config.chunk_sizes, calibrate=config.calibrate
    )
    seconds, per_point = sweep.estimate(
        spec, dtypes, per, rates, peers=config.peers, compile=config.compile, llama_files_per_dtype=llama_files, **runs
    )
    return (
        replace(config, dtypes=dtypes),
        sweep.Plan(dtypes, per, (*notes, *dt_notes), seconds, per_point),
        spec,
        model_path,
    )


def run_bench(
    config: BenchConfig, on_step: Callable[[str, float], None] | None = None, prepared: sweep.Plan | None = None
) -> BenchResult:
    """Run the sweep; `on_step(description, estimated seconds of that point)` is called after each timed point."""
    import torch

    from prefill.engine.llm import Engine
    from prefill.machine.probe import measure_gemm_rate

    config, the_plan, _spec, model_path = prepare(config) if prepared is None else (config, prepared, None, None)
    if model_path is None:
        from prefill.loading.resolve import model_path as checked_path

        model_path = str(checked_path(config.model))
    step = on_step or (lambda _d, _s: None)
    threads = config.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    gemm = {dt: measure_gemm_rate(dt, device=config.device, threads=threads) for dt in config.dtypes}
    result: BenchResult | None = None
    longest = max(max(v) for v in the_plan.lengths.values())
    for i, dtype in enumerate(config.dtypes):
        weights = config.weights if dtype == "float32" else dtype  # GGUF blocks run with float32 activations
        acts = None if config.activations == "auto" else config.activations
        engine = Engine.load(
            model_path, dtype, config.device, threads, progress=False, weights=weights, activations=acts
        )
        engine.profile()  # the time model's probe before the peers' children start (see bench.versus._versus_at)
        kernels = _compile_both(engine) if config.compile else None
        if result is None:
            result = _new_result(config, model_path, engine.spec, threads, gemm)
            result.notes.extend(the_plan.notes)
            prompt = _prompt_ids(engine.tokenizer, longest, engine.spec.vocab_size)
        result.notes.append(f"ours in {dtype}: {engine.path_label}")
        if kernels is not None:
            result.notes.append(f"ours compiled with torch.compile (Engine.compile) in {kernels[2]:.1f} s ({dtype})")
        peers = load_llamacpp_peers(config, model_path, dtype, i == 0, longest, threads, result.notes)
        peers.append(load_transformers_peer(config, model_path, dtype, threads, result.notes))
        peers = alive_peers(peers, result)
        lengths = the_plan.lengths[dtype]
        weigh = lambda P, dt=dtype: the_plan.point_seconds.get((dt, P), 1.0)  # noqa: E731
        try:
            _sweep_dtype(engine, kernels, peers, dtype, lengths, prompt, gemm, config, result, step, weigh)
        finally:
            for p in peers:
                p.close()
        del engine, peers
        gc.collect()
    assert result is not None  # config.dtypes is never empty
    _save_compile_verdicts(result, config)
    rate_again(result, gemm, threads)
    return result


def _compile_both(engine) -> tuple[tuple, tuple, float]:
    """(eager kernels, compiled kernels, compile seconds): the engine then runs either by swapping the two
    per-block functions, so eager and compiled are timed interleaved on the same weights."""
    k = engine.model.kernels
    eager = (k.qkv_rotary, k.out_and_mlp)
    seconds = engine.compile()
    compiled = (k.qkv_rotary, k.out_and_mlp)
    return eager, compiled, seconds


def _prefill_with(engine, fns: tuple, ids):
    engine.model.kernels.qkv_rotary, engine.model.kernels.out_and_mlp = fns
    return engine.prefill(ids)


def _sweep_dtype(
    engine, kernels, peers, dtype, lengths, prompt, gemm, config: BenchConfig, result, step, weigh
) -> None:
    import torch

    profile = engine.profile(echo=result.notes.append)  # the time model's: probed here on first need, said in a note
    result.notes.append(f"pred. ({dtype}): the time model on the {profile.kind} profile ({profile.source})")
    for P in lengths:
        ids = torch.tensor([prompt[:P]], device=config.device)  # [1, P]
        count = prefill_flops_exact(engine.spec, P)
        if kernels is None:
            runs = {(OURS, dtype): lambda ids=ids: engine.prefill(ids)}
        else:
            runs = {
                (OURS, dtype): lambda ids=ids: _prefill_with(engine, kernels[0], ids),
                (OURS_COMPILED, dtype): lambda ids=ids: _prefill_with(engine, kernels[1], ids),
            }
        for peer in peers:  # each in its child process, its own seconds (prefill.bench.peer_process)
            runs[(peer.name, peer.dtype)] = PeerRun(peer, prompt[:P])
        timings, memory = time_point(runs, peers, dtype, P, config, result)
        pred = engine.predict_prefill(P)
        for key in runs:
            result.measurements.append(_measurement(*key, P, None, timings[key], memory[key], count, gemm, pred))
        step(f"{dtype} P={P}: {', '.join(name for name, _ in runs)}", weigh(P))
    if kernels is not None:
        engine.model.kernels.qkv_rotary, engine.model.kernels.out_and_mlp = kernels[0]  # calibrate eager
    if config.calibrate:
        try:
            result.calibrations[dtype] = _calibrate(engine, dtype, lengths, prompt, result, config)
        except BadInput as e:  # a failed fit must not throw away the sweep that was measured
            result.notes.append(f"{dtype} calibration failed: {e}")
    _chunk_sweep(engine, dtype, max(lengths), prompt, gemm, config, result, step)


def _measure(
    name: str,
    dtype: str,
    P: int,
    chunk: int | None,
    fn: Callable[[], object],
    count: FlopCount,
    gemm: dict[str, float],
    config: BenchConfig,
    pred,
) -> Measurement:
    with _inference():
        timing = time_call(fn, repeats=config.repeats, warmup=config.warmup, device=config.device)
        memory = measure_peak_memory(fn, device=config.device)  # one more, untimed call
    return _measurement(name, dtype, P, chunk, timing, memory, count, gemm, pred)


def _measurement(
    name: str,
    dtype: str,
    P: int,
    chunk: int | None,
    timing: Timing,
    memory: PeakMemory,
    count: FlopCount,
    gemm: dict[str, float],
    pred,
) -> Measurement:
    """One timed point; `pred`: the time model's Prediction of our engine at this point."""
    rate = gemm.get(dtype)
    median = timing.median_s
    return Measurement(
        engine=name,
        dtype=dtype,
        P=P,
        chunk_size=chunk,
        cold_s=timing.cold_s,
        median_s=median,
        p90_s=timing.p90_s,
        samples_s=timing.samples_s,
        tokens_per_s=P / median,
        flops=count.total,
        flops_per_s=count.total / median,
        mfu=mfu(count.total, median, rate) if rate else None,
        peak_bytes=memory.peak_bytes,
        peak_delta_bytes=memory.delta_bytes,
        memory_kind=memory.kind,
        predicted_s=pred.seconds,
        predicted_bound=pred.dominant,
    )


def _calibrate(engine, dtype, lengths, prompt, result: BenchResult, config: BenchConfig):
    """Fit on the sweep's medians at `calibrate_on` plus, at each, the second half after the first is cached."""
    import torch

    fit_on = config.calibrate_on or _default_fit_lengths(lengths)
    missing = [P for P in fit_on if P not in lengths]
    if missing:
        raise BadInput(f"--calibrate-on lengths {missing} are not in the sweep {list(lengths)}")
    plain = [
        calibrate.Observation(m.P, prefill_flops_exact(engine.spec, m.P), m.median_s)
        for m in result.measurements
        if m.engine == OURS and m.dtype == dtype and m.chunk_size is None
    ]
    halves = []
    for P in fit_on:
        half = P // 2
        ids = torch.tensor([prompt[:P]], device=config.device)  # [1, P]
        cache = engine.new_cache(P)
        engine.prefill(ids[:, :half], cache)  # positions 0..half-1 stay cached across the repeats

        def second_half(cache=cache, half=half, ids=ids):
            cache.truncate(half)
            engine.prefill(ids[:, half:], cache)

        with _inference():
            tm = time_call(second_half, repeats=config.repeats, warmup=config.warmup, device=config.device)
        count = prefill_flops_exact(engine.spec, P - half, past=half)
        halves.append(calibrate.Observation(P - half, count, tm.median_s, past=half))
    fitted = [ob for ob in plain if ob.P in fit_on] + halves
    cal = calibrate.fit_calibration(
        fitted,
        dtype=dtype,
        threads=result.machine["threads"],
        source=f"prefill bench --calibrate on P={','.join(map(str, fit_on))} ({result.spec.name})",
    )
    rep = calibrate.report(cal, plain + halves, fitted)
    by_p = {row.P: row.predicted_s for row in rep.sweep}
    result.measurements[:] = [
        _with_calibrated(m, by_p[m.P]) if m.engine == OURS and m.dtype == dtype and m.chunk_size is None else m
        for m in result.measurements
    ]
    return rep


def _with_calibrated(m: Measurement, seconds: float) -> Measurement:
    return replace(m, calibrated_s=seconds)


def _default_fit_lengths(lengths: tuple[int, ...]) -> tuple[int, ...]:
    if len(lengths) < 2:
        raise BadInput("--calibrate needs at least two prompt lengths in the sweep")
    return (lengths[1] if len(lengths) > 2 else lengths[0], lengths[-1])


def _chunk_sweep(engine, dtype, P, prompt, gemm, config: BenchConfig, result: BenchResult, step) -> None:
    import torch

    ids = torch.tensor([prompt[:P]], device=config.device)  # [1, P]
    count = prefill_flops_exact(engine.spec, P)
    for C in config.chunk_sizes:
        pred = engine.predict_prefill(P, chunk_size=C)
        result.measurements.append(
            _measure(OURS, dtype, P, C, lambda C=C: engine.prefill(ids, chunk_size=C), count, gemm, config, pred)
        )
        step(f"{OURS} {dtype} P={P} chunk={C}", 1.0)


def _capped_lengths(lengths: tuple[int, ...], spec: ModelSpec, notes: list[str]) -> tuple[int, ...]:
    kept = tuple(sorted({P for P in lengths if spec.context_length >= P}))
    if len(kept) < len(set(lengths)):
        notes.append(f"prompt lengths above the context length {spec.context_length} were dropped")
    if not kept:
        raise BadInput(f"every prompt length exceeds the model's context length {spec.context_length}")
    return kept


def _prompt_ids(tokenizer, P: int, vocab_size: int) -> list[int]:
    # a model folder without tokenizer.json still benchmarks: fixed ids spread over the vocabulary
    base = tokenizer.encode(PROMPT_TEXT) if tokenizer is not None else [(7919 * i + 11) % vocab_size for i in range(97)]
    return (base * (P // len(base) + 1))[:P]


def _save_compile_verdicts(result: BenchResult, config: BenchConfig) -> None:
    """Remember, per dtype, whether compiling beat eager at the P nearest VERDICT_P (for `run --compile`)."""
    from prefill.machine.native import CompileVerdict, save_compile_verdict

    for dt in config.dtypes:
        pairs = [
            (m, result.find(OURS_COMPILED, dt, m.P))
            for m in result.measurements
            if m.engine == OURS and m.dtype == dt and m.chunk_size is None
        ]
        pairs = [(e, c) for e, c in pairs if c is not None]
        if not pairs:
            continue
        e, c = min(pairs, key=lambda ec: abs(ec[0].P - VERDICT_P))
        verdict = CompileVerdict(dt, e.P, e.tokens_per_s, c.tokens_per_s)
        save_compile_verdict(verdict, config.device, result.machine["threads"])
        result.notes.append(verdict.message().replace("in the last bench", "in this bench"))


def _new_result(config, model_path, spec, threads, gemm) -> BenchResult:
    import torch

    from prefill.bench.published import cpu_family
    from prefill.device.capability import capability, cpu_name

    cap = capability("cuda" if config.device.startswith("cuda") else "cpu")
    machine = {
        "cpu": cpu_name(),
        "capability": cap.kind,
        "isa": cap.isa,
        "flags": sorted(cap.flags),
        "cpu_family": cpu_family(),
        "native_dtypes": list(cap.native_dtypes()),
        "cores": os.cpu_count(),
        "threads": threads,
        "device": config.device if config.device == "cpu" else torch.cuda.get_device_name(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers_version(),
        "llama_cpp": llamacpp_version(),
    }
    return BenchResult(config=config, model=model_path, spec=spec, machine=machine, gemm_flops_per_s=gemm)


def _inference():
    # inference_mode for every engine's calls, so none pays for autograd bookkeeping
    import torch

    return torch.inference_mode()
