"""Published results: one JSON file per machine kind and benchmark, docs/results/<kind>/<benchmark>.json.

Each file holds one current table (its columns and rows, as the benchmark printed them), the machine it was
measured on, the command that reproduces it, its date and commit, and optionally a headline (the few figures the
README shows) and a plot spec. scripts/render_performance.py renders docs/performance.md and the README's
Performance section from these files alone, so publishing a figure is writing one file and rendering again.
The format is described in docs/results/README.md.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from prefill.errors import BadInput

FORMAT = 1
ROOT = Path(__file__).resolve().parents[3]
RESULTS_DIR = ROOT / "docs" / "results"
_SLUG = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
_NAME = re.compile(r"^[a-z0-9_]+$")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
# The suffix of a CPU kind's slug, from Capability.kind (the matrix hardware it multiplies with).
_KIND_SUFFIX = {"AMX": "avx512-amx", "AVX512-BF16": "avx512-bf16", "AVX512": "avx512", "AVX2": "avx2"}
# AMD's core generation by (cpu family, has AVX-512): family 25 is Zen 3 without AVX-512 and Zen 4 with it.
_ZEN = {(23, False): "zen2", (25, False): "zen3", (25, True): "zen4", (26, True): "zen5"}
# The 1-minute load average when the benchmark started (its script imports this module first thing): read at
# the end, the load would count the benchmark's own threads.
START_LOAD = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0


@dataclass(frozen=True)
class Machine:
    """What a figure was measured on. kind: Capability.kind ("AVX2", "AMX", "CUDA"); flags: the matrix-relevant
    /proc/cpuinfo flags; conditions: how busy it was ("quiet", "shared, load average 5-7"), said beside the table."""

    name: str
    kind: str
    flags: tuple[str, ...] = ()
    cores: int | None = None
    threads: int | None = None
    torch: str = ""
    shared: bool = False  # other work ran on the machine: only ratios within one run hold
    conditions: str = ""


@dataclass(frozen=True)
class Result:
    """One benchmark's current table on one machine kind (one results file)."""

    benchmark: str  # the file's name: "serving_core", "bench", "kv_store"
    kind: str  # the folder: "zen3-avx2", "xeon-avx512-amx", "h200"
    title: str
    machine: Machine
    command: str
    date: str  # YYYY-MM-DD
    commit: str
    columns: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    notes: str = ""  # a few sentences under the table: what it shows, other runs
    headline: tuple[str, ...] = ()  # the figures the README quotes, each a short phrase
    plot: dict[str, Any] | None = None  # {"x": column, "y": [columns], "group": column?, "logx": bool, ...}
    data: dict[str, Any] = field(default_factory=dict)  # the benchmark's own JSON record, for re-analysis

    def __post_init__(self) -> None:
        check(self)

    def to_json(self) -> dict[str, Any]:
        """Plain JSON data, with the format's version first."""
        d = asdict(self)
        d["columns"], d["rows"] = list(self.columns), [list(r) for r in self.rows]
        d["headline"], d["machine"]["flags"] = list(self.headline), list(self.machine.flags)
        return {"format": FORMAT, **d}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Result:
        """A Result from a results file's data; BadInput naming what is missing or wrong."""
        if d.get("format") != FORMAT:
            raise BadInput(f"results file format {d.get('format')!r}: this version reads format {FORMAT}")
        d = {k: v for k, v in d.items() if k != "format"}
        try:
            machine = dict(d.pop("machine"))
            return cls(
                **{
                    **d,
                    "machine": Machine(**{**machine, "flags": tuple(machine.get("flags", ()))}),
                    "columns": tuple(d["columns"]),
                    "rows": tuple(tuple(r) for r in d["rows"]),
                    "headline": tuple(d.get("headline", ())),
                }
            )
        except (TypeError, KeyError) as e:
            raise BadInput(f"a results file's fields are wrong ({e}); see docs/results/README.md") from None


def check(r: Result) -> None:
    """BadInput unless `r` is a well-formed results file: names, date, and every row as long as the columns."""
    if not _SLUG.match(r.kind):
        raise BadInput(f"kind {r.kind!r} must be lower-case words joined by '-' (e.g. zen3-avx2, h200)")
    if not _NAME.match(r.benchmark):
        raise BadInput(f"benchmark {r.benchmark!r} must be lower-case letters, digits and '_'")
    if not _DATE.match(r.date):
        raise BadInput(f"date {r.date!r} must be YYYY-MM-DD")
    if not r.columns or not r.rows:
        raise BadInput(f"{r.kind}/{r.benchmark}: a results file needs columns and at least one row")
    for row in r.rows:
        if len(row) != len(r.columns):
            raise BadInput(f"{r.kind}/{r.benchmark}: row {list(row)} has {len(row)} cells for {len(r.columns)} columns")
    if r.plot is not None:
        missing = [c for c in [r.plot.get("x"), *r.plot.get("y", []), r.plot.get("group")] if c and c not in r.columns]
        if missing or not r.plot.get("x") or not r.plot.get("y"):
            raise BadInput(f"{r.kind}/{r.benchmark}: the plot's x, y and group must name columns (not {missing})")


def kind_slug(name: str, kind: str, family: int | None = None, flags: frozenset[str] = frozenset()) -> str:
    """A machine kind's folder name: 'zen3-avx2', 'zen5-avx512-bf16', 'xeon-avx512-amx', 'h200'.

    name: the CPU or GPU name; kind: Capability.kind; family: /proc/cpuinfo's "cpu family" (tells AMD's Zen
    generations apart)."""
    if kind == "CUDA":
        words = [w for w in re.split(r"[^a-z0-9]+", name.lower()) if w and w not in ("nvidia", "geforce", "tesla")]
        return "-".join(words) or "cuda"
    suffix = _KIND_SUFFIX.get(kind, re.sub(r"[^a-z0-9]+", "-", kind.lower()).strip("-") or "cpu")
    lower = name.lower()
    if "amd" in lower or "epyc" in lower or "ryzen" in lower:
        vendor = _ZEN.get((family or 0, kind != "AVX2"), "amd")
    elif "xeon" in lower:
        vendor = "xeon"
    elif "intel" in lower or "genuineintel" in lower:
        vendor = "intel"
    else:
        vendor = re.sub(r"[^a-z0-9]+", "-", lower).strip("-")[:20] or "cpu"
    return f"{vendor}-{suffix}"


def cpu_family(cpuinfo: str | None = None) -> int | None:
    """/proc/cpuinfo's "cpu family" (None where unreadable)."""
    try:
        text = Path("/proc/cpuinfo").read_text() if cpuinfo is None else cpuinfo
    except OSError:
        return None
    found = re.search(r"^cpu family\s*:\s*(\d+)", text, re.M)
    return int(found.group(1)) if found else None


def this_machine(device: str = "cpu", threads: int | None = None, conditions: str = "") -> tuple[str, Machine]:
    """This machine's kind slug and Machine. Shared when the 1-minute load average at the benchmark's start
    (START_LOAD) is above half its cores (other work ran: only ratios within the run hold); said in `conditions`."""
    import torch

    from prefill.device.capability import capability

    cap = capability("cuda" if device.startswith("cuda") else "cpu")
    cores = os.cpu_count() or 1
    load = START_LOAD
    said = f"load average {load:.1f} on {cores} cores at the start" + (f"; {conditions}" if conditions else "")
    machine = Machine(
        name=cap.name,
        kind=cap.kind,
        flags=tuple(sorted(cap.flags)),
        cores=cores,
        threads=threads if threads is not None else torch.get_num_threads(),
        torch=torch.__version__,
        shared=load > cores / 2,
        conditions=said,
    )
    return kind_slug(cap.name, cap.kind, cpu_family(), cap.flags), machine


def git_commit() -> str:
    """The short commit the working tree is at, '+' when its code has uncommitted changes; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        # the pages and files that publishing itself rewrites do not make a measurement's code uncommitted
        ours = [":(exclude)docs/results", ":(exclude)docs/performance.md", ":(exclude)README.md"]
        status = ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *ours]
        dirty = subprocess.run(status, cwd=ROOT, capture_output=True)
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("+" if dirty.stdout.strip() else "")


def command_line(argv: list[str] | None = None, program: str | None = None) -> str:
    """The command that reproduces this run: the script's arguments without --publish."""
    argv = list(sys.argv if argv is None else argv)
    args, rest = [], argv[1:]
    while rest:
        a = rest.pop(0)
        if a == "--publish":
            if rest and not rest[0].startswith("-"):
                rest.pop(0)  # its DIR
        elif not a.startswith("--publish="):
            args.append(a)
    prog = program or (os.path.relpath(argv[0], ROOT) if argv else "?")
    return shlex.join([".venv/bin/python", prog, *args]) if prog.endswith(".py") else shlex.join([prog, *args])


def publish_option() -> dict[str, Any]:
    """add_argument's keywords for --publish [DIR]: also write the results file under DIR/<this kind>/ (DIR
    defaults to docs/results). Scripts spell `ap.add_argument("--publish", **publish_option())`, so the docs'
    check reads the option from their source."""
    return {
        "nargs": "?",
        "const": str(RESULTS_DIR),
        "default": None,
        "metavar": "DIR",
        "help": "also write this run's table as DIR/<this machine's kind>/<benchmark>.json (default DIR: docs/results)",
    }


OVERRIDES = ("kind", "date", "commit", "conditions")


def publish_main(argv: list[str] | None, prog: str, what: str, publish_fn, show=None) -> int:
    """`python -m PROG RUN_JSON [--publish [DIR]] [--kind K] [--date D] [--commit C] [--conditions TEXT]`: a run's
    JSON file (`what`: its name) published by publish_fn(data, root, **overrides), or, without --publish,
    show(data) printed. One line and exit 2 on a file that is not one."""
    import argparse

    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=f"Publish a {what} as a results file.")
    ap.add_argument("run_json", type=Path, metavar=what.upper().replace(".", "_"))
    ap.add_argument("--publish", **publish_option())
    for name in OVERRIDES:
        ap.add_argument(f"--{name}", default=None, help=f"the results file's {name} (default: the run's)")
    args = ap.parse_args(argv)
    try:
        data = json.loads(args.run_json.read_text())
        if args.publish is None and show is not None:
            sys.stdout.write(show(data))
            return 0
        given = {k: v for k in OVERRIDES if (v := getattr(args, k)) is not None}
        print(f"wrote {publish_fn(data, args.publish or RESULTS_DIR, **given)}")
    except BadInput as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {args.run_json}: not a {what} ({e})", file=sys.stderr)
        return 2
    return 0


def publish(root: str | Path, benchmark: str, title: str, columns, rows, **fields: Any) -> Path:
    """Write this run as a results file under root/<this machine's kind>/; returns its path.

    fields: command (default: this process's command line), device, threads, conditions, and the Result's
    optional notes, headline, plot and data."""
    device, threads = fields.pop("device", "cpu"), fields.pop("threads", None)
    kind, machine = this_machine(device, threads, fields.pop("conditions", ""))
    result = Result(
        benchmark=benchmark,
        kind=kind,
        title=title,
        machine=machine,
        command=fields.pop("command", None) or command_line(),
        date=datetime.date.today().isoformat(),
        commit=git_commit(),
        columns=tuple(columns),
        rows=tuple(tuple(r) for r in rows),
        **fields,
    )
    return write(result, root)


def write(result: Result, root: str | Path = RESULTS_DIR) -> Path:
    """root/<kind>/<benchmark>.json, replacing an older measurement of the same kind and benchmark."""
    path = Path(root) / result.kind / f"{result.benchmark}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(result))
    return path


def dumps(result: Result) -> str:
    """The results file's text: indented, with the columns, each row and the flags on one line each (diffable)."""
    d = result.to_json()
    one_line = {"columns": d["columns"], "flags": d["machine"]["flags"], "headline": d["headline"]}
    rows = d["rows"]
    d["rows"], d["machine"]["flags"] = "@rows@", "@flags@"
    d["columns"], d["headline"] = "@columns@", "@headline@"
    text = json.dumps(d, indent=1, ensure_ascii=False)
    for key, value in one_line.items():
        text = text.replace(f'"@{key}@"', json.dumps(value, ensure_ascii=False))
    body = ",\n  ".join(json.dumps(r, ensure_ascii=False) for r in rows)
    return text.replace('"@rows@"', f"[\n  {body}\n ]") + "\n"


def load(path: str | Path) -> Result:
    """One results file; BadInput naming the file when it is not valid JSON or not in the format."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise BadInput(f"{path}: not a readable results file ({e})") from None
    try:
        result = Result.from_json(data)
    except BadInput as e:
        raise BadInput(f"{path}: {e}") from None
    if (result.kind, result.benchmark) != (path.parent.name, path.stem):
        raise BadInput(f"{path}: says kind {result.kind!r} and benchmark {result.benchmark!r}; move it or fix it")
    return result


def load_all(root: str | Path = RESULTS_DIR) -> dict[str, list[Result]]:
    """Every results file under root, by kind (folders sorted), each kind's files sorted by benchmark name."""
    out: dict[str, list[Result]] = {}
    for folder in sorted(p for p in Path(root).iterdir() if p.is_dir()):
        results = [load(f) for f in sorted(folder.glob("*.json"))]
        if results:
            out[folder.name] = results
    return out
