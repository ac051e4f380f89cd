"""Ours against llama.cpp on the same GGUF file, in llama-bench's conventions: `pp P` (a prompt of P tokens
from an empty cache, tokens/s = P / seconds) and `tg @ dS` (one token at a time after S tokens of context,
tokens/s = 1 / seconds per step), each at the same thread count for both engines, their repeats interleaved.

Beside every decode row: the bytes a step reads (weights as each engine stores them, plus its K/V at its KV
dtype, from prefill.costmodel.storage) over the read bandwidth measured in the same run, i.e. the memory floor
of that step, and the fraction of it the step reached.
"""

from __future__ import annotations

import gc
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from prefill.bench import published
from prefill.bench.peer_process import PeerCrashed, PeerProcess
from prefill.bench.timing import SelfTimed, call_seconds, measure_read_bandwidth, settle
from prefill.costmodel.storage import decode_step_bytes, gguf_file_storage
from prefill.errors import BadInput

PP_LENGTHS = (1, 8, 32, 128, 512)
TG_DEPTHS = (64, 1024)
LLAMA_KV_BYTES = 2  # llama.cpp's default K/V cache type is f16


@dataclass(frozen=True)
class VersusConfig:
    """What to measure. `model` None: the embedded SmolLM2 GGUF; `weights`: ours, one engine per storage
    ("native", "float32", ...; "native:q8" the blocks with 8-bit activations)."""

    model: str | None = None
    prompt_lengths: tuple[int, ...] = PP_LENGTHS
    depths: tuple[int, ...] = TG_DEPTHS
    threads: tuple[int, ...] = (1, 2)
    weights: tuple[str, ...] = ("native",)
    repeats: int = 5
    tg_steps: int = 16  # decode steps timed per repeat (the median step is kept)
    clock: str = "wall"  # or "cpu": the calling thread's CPU time, 1 thread only (both engines compute in it),
    # which other processes on a shared machine do not inflate
    predict: bool = True  # each of our rows beside the time model's prediction (a quick probe per path: seconds)


@dataclass(frozen=True)
class Row:
    """One engine on one test: median seconds (of the whole prefill for pp, of one step for tg)."""

    test: str  # "pp 32" or "tg @ d64"
    threads: int
    engine: str  # "prefill (Q4_1 + Q8_0)", "llama.cpp (Q4_1 + Q8_0)"
    seconds: float
    tokens_per_s: float
    step_bytes: int | None = None  # decode rows: bytes read per step
    floor_s: float | None = None  # step_bytes / read bandwidth
    status: str = ""  # "crashed (signal 11)" where the engine's child process died at this test (no figures)
    predicted_s: float | None = None  # ours: the time model's seconds on this path's probed profile


@dataclass
class VersusResult:
    config: VersusConfig
    rows: list[Row] = field(default_factory=list)
    bandwidth: dict[int, float] = field(default_factory=dict)  # threads -> read bytes/s
    notes: list[str] = field(default_factory=list)


@dataclass(eq=False)
class Contender:
    """One engine of the comparison: how it prefills, how it steps, and what a step reads."""

    name: str
    prefill: Callable[[list[int]], object]  # a whole prefill of the ids from an empty cache
    fill_then_step: Callable[[list[int]], Callable[[], object]]  # fill the context, return one decode step
    storage: tuple[str, str]  # (projections, embedding), as prefill.costmodel.storage names them
    kv_bytes: float  # bytes per K/V element (costs.kv_bytes_per_element)
    predict: Callable[[str, int], float] | None = None  # ours: ("pp", P) or ("tg", S) -> predicted seconds
    pid: int | None = None  # the process whose threads run it: quiet (timing.settle) before the next is timed


def run_versus(config: VersusConfig, on_step: Callable[[str], None] | None = None) -> VersusResult:
    """Every pp and tg test at every thread count, ours (one engine per `weights`) and llama.cpp interleaved;
    llama.cpp in a child process, so that its crash is a row that says so and the tests go on without it."""
    from prefill.bench.peers import llamacpp_available
    from prefill.loading import default_model_path

    if not llamacpp_available():
        raise BadInput("llama-cpp-python is not installed: pip install 'prefill[llamacpp]'")
    path = str(default_model_path()) if config.model is None else config.model
    if not path.endswith(".gguf"):
        raise BadInput(f"the llama.cpp comparison needs a .gguf file, got {path}")
    if config.clock == "cpu" and set(config.threads) != {1}:
        raise BadInput("CPU time measures one thread: run the comparison with --threads 1")
    result, extra_bufts = VersusResult(config), True
    for threads in config.threads:  # once llama.cpp's extra buffer types crashed, they stay off
        extra_bufts = _versus_at(config, path, threads, result, on_step or (lambda _s: None), extra_bufts)
    return result


def _versus_at(config: VersusConfig, path: str, threads: int, result: VersusResult, say, extra_bufts: bool) -> bool:
    """Every test at `threads` threads into `result`, llama.cpp starting with its extra buffer types on or off
    (`extra_bufts`); returns whether they were still on at the end."""
    import torch

    from prefill.bench.runner import _prompt_ids
    from prefill.engine.llm import Engine

    n_ctx = max(max(config.prompt_lengths), max(config.depths) + config.tg_steps + 8)
    file_types = gguf_file_storage(path)
    torch.set_num_threads(threads)
    ours = [
        Engine.load(path, threads=threads, progress=False, weights=w, activations=acts or None)
        for w, _, acts in (w.partition(":") for w in config.weights)
    ]
    if config.predict:  # each path probed before llama.cpp's child starts: its threads spin after each eval
        for engine in ours:
            engine.profile()
    contenders = [_ours(e, file_types, config.predict) for e in ours]
    llama = _LlamaSeat({"path": path, "n_ctx": n_ctx, "threads": threads}, file_types, config.clock, result)
    llama.extra_bufts = extra_bufts
    llama.start("load")
    for engine in ours:
        engine.warmup()
    spec = ours[0].spec
    result.bandwidth[threads] = measure_read_bandwidth(threads, clock=config.clock)
    prompt = _prompt_ids(ours[0].tokenizer, n_ctx, spec.vocab_size)
    tests = [(f"pp {P}", P, _pp) for P in config.prompt_lengths] + [(f"tg @ d{S}", S, _tg) for S in config.depths]
    with torch.inference_mode():
        for test, n, measure in tests:
            medians = llama.measure(test, measure, contenders, prompt[:n], config)
            for c, seconds in medians.items():
                row = Row(test, threads, c.name, seconds, (n if measure is _pp else 1) / seconds)
                if c.predict is not None:
                    row = replace(row, predicted_s=c.predict("pp" if measure is _pp else "tg", n))
                if measure is _tg:
                    nbytes = decode_step_bytes(spec, *c.storage, n, c.kv_bytes)
                    row = replace(row, step_bytes=nbytes, floor_s=nbytes / result.bandwidth[threads])
                result.rows.append(row)
            say(f"{test}, {threads} threads")
    llama.close()
    del ours, contenders
    gc.collect()
    return llama.extra_bufts


EXTRA_BUFTS_OFF = "extra buffer types off"
EXTRA_BUFTS_WHY = (
    "llama.cpp's extra buffer types (its weight repacking, AMX's among them) crash on some CPUs (llama.cpp#20824): "
    f"the rows marked '{EXTRA_BUFTS_OFF}' ran without them (llama_model_params.use_extra_bufts = false)"
)


class _LlamaSeat:
    """llama.cpp in its child process, at one thread count. Where the child dies (at load or at a test) it is
    a row that says so; with its extra buffer types on, it starts again with them off (EXTRA_BUFTS_WHY) and the
    test is measured again; a second death leaves every later test without it."""

    def __init__(self, kwargs: dict, file_types: tuple[str, str], clock: str, result: VersusResult) -> None:
        self.kwargs, self.file_types, self.clock, self.result = kwargs, file_types, clock, result
        self.extra_bufts, self.peer, self.contenders = True, None, []

    @property
    def name(self) -> str:
        return f"llama.cpp ({_label(self.file_types)}{'' if self.extra_bufts else '; ' + EXTRA_BUFTS_OFF})"

    def start(self, test: str) -> None:
        """The child started (its contender in self.contenders); its crash while loading recorded at `test`."""
        from prefill.bench.peers import load_llamacpp_child

        kwargs = self.kwargs if self.extra_bufts else {**self.kwargs, "extra_bufts": False}
        try:
            self.peer = PeerProcess(load_llamacpp_child, kwargs, "llamacpp", "gguf")
            self.contenders = [_llama(self.peer, self.file_types, self.clock, self.name)]
        except PeerCrashed as e:
            self.crashed(test, e, "while loading ")

    def measure(self, test: str, measure: Callable, ours: list[Contender], ids: list[int], config) -> dict:
        """measure(ours and llama.cpp, ids, config), again after each crash of the child."""
        while True:
            try:
                return measure(ours + self.contenders, ids, config)
            except PeerCrashed as e:  # only the child can die this way
                self.close()
                self.crashed(test, e, "at ")

    def crashed(self, test: str, e: PeerCrashed, when: str) -> None:
        threads = self.kwargs["threads"]
        self.result.rows.append(Row(test, threads, self.name, float("nan"), float("nan"), status=e.reason))
        self.result.notes.append(f"{self.name} {e.reason} {when}{test} ({threads} threads); its log: {e.log_path}")
        self.peer, self.contenders = None, []
        if self.extra_bufts:
            self.extra_bufts = False
            self.result.notes += [EXTRA_BUFTS_WHY] * (EXTRA_BUFTS_WHY not in self.result.notes)
            self.start(test)

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
        self.peer, self.contenders = None, []


def _label(storage: tuple[str, str]) -> str:
    return storage[0] if storage[0] == storage[1] else f"{storage[0]} + {storage[1]}"


def _ours(engine, file_types: tuple[str, str], predicts: bool = True) -> Contender:
    import torch

    native = engine.weights not in ("float32", "bfloat16", "float16")
    storage = file_types if native else (engine.weights, engine.weights)

    def fill_then_step(ids: list[int]) -> Callable[[], object]:
        _, cache = engine.prefill(ids, engine.new_cache(len(ids) + 1))
        token = torch.tensor([ids[-1]])
        return lambda: (cache.truncate(len(ids)), engine.decode_step(token, cache))

    def predict(kind: str, n: int) -> float:
        """The time model on this path's own probed profile (its kernels, its dtype): a whole prefill of n
        tokens, or one decode step after n cached ones, as each test measures it."""
        return (engine.predict_prefill(n) if kind == "pp" else engine.predict_decode([n])).seconds

    acts = ", 8-bit activations" if engine.activations == "q8" else ""
    name = f"prefill ({_label(storage)}{acts})"
    predicted = predict if predicts else None
    return Contender(name, engine.prefill, fill_then_step, storage, engine.kv_bytes, predicted, pid=os.getpid())


def _llama(peer: PeerProcess, file_types: tuple[str, str], clock: str, name: str) -> Contender:
    """llama.cpp in its child: each prefill and step timed there, on `clock` (LlamaCppPeer.fill / step)."""

    def fill_then_step(ids: list[int]) -> Callable[[], object]:
        peer.call("fill", list(ids))
        return lambda: SelfTimed(peer.call("timed", "step", (), clock))

    def prefill(ids: list[int]) -> SelfTimed:
        return peer.prefill(ids, clock)

    return Contender(name, prefill, fill_then_step, file_types, LLAMA_KV_BYTES, pid=peer.pid)


def _pp(contenders: list[Contender], ids: list[int], config: VersusConfig) -> dict[Contender, float]:
    """Median seconds of one whole prefill, repeats interleaved after one warm-up each."""
    for c in contenders:
        c.prefill(ids)
        settle(c.pid)
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(config.repeats):
        for c in contenders:
            samples[c.name].append(call_seconds(lambda c=c: c.prefill(ids), config.clock))
            settle(c.pid)  # its threads quiet before the next engine is timed (llama.cpp's spin after an eval)
    return {c: statistics.median(samples[c.name]) for c in contenders}


def _tg(contenders: list[Contender], ids: list[int], config: VersusConfig) -> dict[Contender, float]:
    """Median seconds of one decode step at len(ids) tokens of context: each engine fills the context once,
    then steps (each step rewrites the same position, so the context stays S), in interleaved rounds."""
    steps = {c.name: c.fill_then_step(ids) for c in contenders}
    for c in contenders:
        steps[c.name]()
        settle(c.pid)
    samples: dict[str, list[float]] = {c.name: [] for c in contenders}
    for _ in range(config.repeats):
        for c in contenders:
            samples[c.name].extend(call_seconds(steps[c.name], config.clock) for _ in range(config.tg_steps))
            settle(c.pid)  # steps back to back, as decoding runs them; quiet before the next engine's
    return {c: statistics.median(samples[c.name]) for c in contenders}


COLUMNS = ("test", "threads", "engine", "ms", "predicted ms", "error", "tok/s", "vs llama.cpp", "bytes/step",
           "floor ms", "of floor")  # fmt: skip


def versus_cells(data: dict) -> list[list[str]]:
    """The table's cells of a result as plain data (to_json): each engine's time, ours beside the time model's
    prediction on that path's profile (error: predicted / measured - 1), our speed over llama.cpp's at the same
    test and threads, and a decode step's memory floor."""
    rows, cells = data["rows"], []
    for row in rows:
        if row.get("status"):  # the engine's child died at this test: no figures
            cells.append([row["test"], str(row["threads"]), row["engine"], row["status"], *[""] * (len(COLUMNS) - 4)])
            continue
        same = (row["test"], row["threads"])
        llama = next(
            (r for r in rows if (r["test"], r["threads"]) == same and "llama" in r["engine"] and not r.get("status")),
            None,
        )
        alive = llama is not None and row is not llama
        ratio = f"{row['tokens_per_s'] / llama['tokens_per_s']:.2f}x" if alive else ""
        floor = (
            ["", "", ""]
            if row["step_bytes"] is None
            else [
                f"{row['step_bytes'] / 1e6:.1f} MB",
                f"{row['floor_s'] * 1e3:.2f}",
                f"{row['floor_s'] / row['seconds']:.0%}",
            ]
        )
        predicted = row.get("predicted_s")
        guess = ["", ""] if predicted is None else [f"{predicted * 1e3:.2f}", f"{predicted / row['seconds'] - 1:+.0%}"]
        cells.append([row["test"], str(row["threads"]), row["engine"], f"{row['seconds'] * 1e3:.2f}", *guess,
                      f"{row['tokens_per_s']:,.1f}", ratio, *floor])  # fmt: skip
    return cells


def caption(data: dict) -> str:
    bw = ", ".join(f"{t} threads {b / 1e9:.1f} GB/s" for t, b in data["bandwidth"].items())
    clock = "thread CPU time" if data["config"]["clock"] == "cpu" else "wall clock"
    quiet = "each engine's threads quiet before the next engine is timed (timing.settle)"
    return f"{clock}, medians; {quiet}; read bandwidth measured in this run: {bw}; floor = bytes/step / bandwidth"


def versus_table(result: VersusResult):
    """A rich Table: one line per (test, threads, engine), our speed over llama.cpp's, decode's memory floor."""
    from rich.table import Table

    table = Table(
        title="ours vs llama.cpp on the same GGUF (llama-bench conventions: pp P, tg @ depth)", title_justify="left"
    )
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("test", "engine") else "right")
    data = to_json(result)
    for cells in versus_cells(data):
        table.add_row(*cells)
    table.caption = caption(data)
    return table


def to_json(result: VersusResult) -> dict:
    """The result as plain data (bench-results/versus.json), with the machine it ran on (read in this process)."""
    from dataclasses import asdict

    kind, machine = published.this_machine(threads=max(result.config.threads))
    return {
        "config": asdict(result.config),
        "machine": asdict(machine) | {"slug": kind},
        "bandwidth": result.bandwidth,
        "rows": [asdict(r) for r in result.rows],
        "notes": result.notes,
    }


def publish(data: dict, root, **fields) -> Path:
    """A versus.json (as loaded) as the results file root/<kind>/llama_bench.json, with the machine it names."""
    import datetime

    if "machine" not in data:
        raise BadInput("this versus.json names no machine (written before results files were): run it again")
    m = dict(data["machine"])
    kind = fields.pop("kind", None) or m.pop("slug")
    m.pop("slug", None)
    m["conditions"] = fields.pop("conditions", None) or m.get("conditions", "")
    c = data["config"]
    command = ["prefill", "bench", "--llama-bench", "--repeats", str(c["repeats"])]
    command += ["--threads", str(c["threads"][0])] if len(c["threads"]) == 1 else []
    command += ["--cpu-time"] * (c["clock"] == "cpu") + (
        ["--weights", c["weights"][0]] if len(c["weights"]) == 1 else []
    )
    result = published.Result(
        benchmark="llama_bench",
        kind=kind,
        title="Native GGUF weights against llama.cpp on the same file",
        machine=published.Machine(**{**m, "flags": tuple(m.get("flags", ()))}),
        command=fields.pop("command", None) or " ".join(command),
        date=fields.pop("date", None) or datetime.date.today().isoformat(),
        commit=fields.pop("commit", None) or published.git_commit(),
        columns=COLUMNS,
        rows=tuple(map(tuple, versus_cells(data))),
        notes=" ".join([caption(data) + ".", *data["notes"]]),
        **fields,
    )
    return published.write(result, root)


def main(argv: list[str] | None = None) -> int:
    """python -m prefill.bench.versus VERSUS_JSON [--publish [DIR]]: `prefill bench --llama-bench`'s run published."""
    return published.publish_main(argv, "prefill.bench.versus", "versus.json", publish)


if __name__ == "__main__":
    raise SystemExit(main())
