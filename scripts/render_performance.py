"""Render docs/performance.md and the README's Performance section from the results files in docs/results/.

Each docs/results/<kind>/<benchmark>.json (prefill.bench.published) becomes one table with its command, date,
commit and machine; docs/results/<kind>/why.md holds the short "why" paragraphs (text before its first
`## <benchmark>` heading goes under the kind's heading, each section beside that benchmark's table); a results
file with a plot spec gets a PNG beside it. The README's section between its performance markers is made from
the files' headlines.

    python scripts/render_performance.py            # write docs/performance.md, the README section, the PNGs
    python scripts/render_performance.py --check    # exit 1 when either page differs from what it renders
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from prefill.bench.published import Result, load_all  # noqa: E402
from prefill.errors import BadInput  # noqa: E402

BEGIN = "<!-- performance:begin: rendered by scripts/render_performance.py from docs/results/, do not edit -->"
END = "<!-- performance:end -->"
START = BEGIN.split(":begin")[0] + ":begin"
# Within a kind, the benchmarks in this order; any other after them, by name.
ORDER = (
    "bench",
    "gpu",
    "predict",
    "serving_core",
    "server_overhead",
    "loaded_server",
    "live_view",
    "llama_bench",
    "kv_store",
    "kv_store_both",
    "kv_store_load",
    "cpu_time",
    "batching",
)
INTRO = """\
Every table on this page is rendered from one results file, `docs/results/<kind>/<benchmark>.json`, by
`scripts/render_performance.py`; each names its machine, the command that reproduces it, its date and its commit.
Some were measured on shared or drifting machines (said beside the table): there, compare ratios within one run
(every engine runs interleaved on the same tokens and threads), not absolute figures across runs. The code has
changed since some were taken: rerun the command on this commit to compare. The methods and scripts are on the
[Benchmarks](benchmarks.md) page, and the results format in `docs/results/README.md`."""


def ordered(results: list[Result]) -> list[Result]:
    rank = {name: i for i, name in enumerate(ORDER)}
    return sorted(results, key=lambda r: (rank.get(r.benchmark, len(ORDER)), r.benchmark))


def kinds_in_order(by_kind: dict[str, list[Result]]) -> list[str]:
    """CPU kinds by name, then GPUs by name."""
    return sorted(by_kind, key=lambda k: (by_kind[k][0].machine.kind == "CUDA", k))


def latest(results: list[Result]) -> Result:
    return max(results, key=lambda r: (r.date, r.benchmark))


def heading(kind: str, r: Result) -> str:
    return f"{r.machine.name}, {r.machine.kind} ({kind})"


def slug(text: str) -> str:
    """The anchor mkdocs and GitHub both give a heading made of words, commas and parentheses."""
    return re.sub(r"\s+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def why_sections(path: Path) -> dict[str, str]:
    """why.md split at its `## <benchmark>` headings; "" holds the text before the first one."""
    if not path.is_file():
        return {}
    sections, name, lines = {}, "", []
    for line in path.read_text().splitlines():
        found = re.match(r"^##\s+(\w+)\s*$", line)
        if found:
            sections[name], name, lines = "\n".join(lines).strip(), found.group(1), []
        else:
            lines.append(line)
    sections[name] = "\n".join(lines).strip()
    return {k: v for k, v in sections.items() if v}


def cell(value) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")


def table(columns, rows) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]


def recorded(r: Result) -> str:
    m = r.machine
    threads = f" on {m.threads} thread{'s' if m.threads != 1 else ''}" if m.threads else ""
    said = f"; {m.conditions}" if m.conditions else ""
    shared = " Shared machine: only the ratios within this run hold." if m.shared else ""
    return f"*Recorded {r.date} at {r.commit}{threads}{said}.*{shared}"


def result_section(r: Result, why: str) -> list[str]:
    lines = [f"### {r.title}", "", recorded(r), "", "```", r.command, "```", "", *table(r.columns, r.rows), ""]
    lines += [r.notes, ""] if r.notes else []
    lines += [why, ""] if why else []
    if r.plot is not None:
        lines += [f"![{r.title}](results/{r.kind}/{r.benchmark}.png)", ""]
    return lines


def performance_md(by_kind: dict[str, list[Result]], root: Path) -> str:
    """The whole page: an index of the kinds, then each kind's tables with their why paragraphs."""
    lines = ["# Performance", "", INTRO, "", "| CPU kind or GPU | machine | benchmarks | latest |", "|---|---|---|---|"]
    for kind in kinds_in_order(by_kind):
        rs, last = ordered(by_kind[kind]), latest(by_kind[kind])
        names = ", ".join(r.benchmark for r in rs)
        lines.append(f"| [{kind}](#{slug(heading(kind, last))}) | {last.machine.name} | {names} | {last.date} |")
    for kind in kinds_in_order(by_kind):
        why, last = why_sections(root / kind / "why.md"), latest(by_kind[kind])
        m = last.machine
        said = [m.kind, f"flags {', '.join(m.flags)}" if m.flags else "", f"{m.cores} cores" if m.cores else ""]
        lines += ["", f"## {heading(kind, last)}", "", f"{m.name}: " + "; ".join(s for s in said if s) + "."]
        lines += ["", why[""]] if why.get("") else []
        lines.append("")
        for r in ordered(by_kind[kind]):
            lines += result_section(r, why.get(r.benchmark, ""))
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).rstrip() + "\n"


def readme_section(by_kind: dict[str, list[Result]]) -> str:
    """The README's Performance section body: every headline, a row per results file that has one."""
    lines = [
        BEGIN,
        "The headline figures, each from its results file in `docs/results/` with its machine, date and commit.",
        "Several come from shared machines, where only the ratios within one run hold.",
        "[Performance](docs/performance.md) has the full tables and the commands that reproduce them.",
        "",
        "| machine (kind) | benchmark | figures | recorded |",
        "|---|---|---|---|",
    ]
    for kind in kinds_in_order(by_kind):
        for r in ordered(by_kind[kind]):
            if r.headline:
                where = f"{r.date}, {r.commit}" + (", shared machine" if r.machine.shared else "")
                figures = "; ".join(r.headline)
                lines.append(f"| {cell(r.machine.name)}, `{kind}` | {cell(r.title)} | {cell(figures)} | {where} |")
    return "\n".join([*lines, END])


def with_readme_section(readme: str, section: str) -> str:
    """The README with its marked section replaced; BadInput when the markers are missing."""
    start, end = readme.find(START), readme.find(END)
    if start < 0 or end < start:
        raise BadInput(f"README.md has no {START} ... {END} markers: add them where the section goes")
    return readme[:start] + section + readme[end + len(END) :]


def number(value) -> float | None:
    """The first number in a cell ('1,119' -> 1119, '55.6 / 62.7' -> 55.6, '67.3%' -> 67.3), or None."""
    found = re.search(r"-?\d[\d,]*\.?\d*", str(value))
    return float(found.group(0).replace(",", "")) if found else None


def draw(r: Result, path: Path) -> None:
    """The plot spec drawn: y columns (or one y per `series` value) against x, one panel per `group` value."""
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec, cols = r.plot or {}, list(r.columns)
    groups = sorted({row[cols.index(spec["group"])] for row in r.rows}) if spec.get("group") else [None]
    fig, axes = plt.subplots(1, len(groups), figsize=(5.5 * len(groups), 4), squeeze=False)
    for ax, group in zip(axes[0], groups, strict=True):
        rows = [row for row in r.rows if group is None or row[cols.index(spec["group"])] == group]
        ticks = set()
        for label, xs, ys in _series(spec, cols, rows):
            ax.plot(xs, ys, marker="o", label=spec.get("labels", {}).get(label, label))
            ticks |= set(xs)
        ax.set_xscale("log" if spec.get("logx", True) else "linear")
        ax.set_xticks(sorted(ticks), [f"{x:,.0f}" for x in sorted(ticks)])
        ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ax.set_yscale("log" if spec.get("logy") else "linear")
        ax.set_xlabel(spec["x"])
        ax.set_ylabel(spec.get("ylabel", ", ".join(spec["y"])))
        ax.set_title(f"{r.kind}" + (f", {group}" if group else ""))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(r.title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _series(spec: dict, cols: list[str], rows) -> list[tuple[str, list[float], list[float]]]:
    x = cols.index(spec["x"])
    if spec.get("series"):
        s, y = cols.index(spec["series"]), cols.index(spec["y"][0])
        names = list(dict.fromkeys(row[s] for row in rows))
        return [_points(str(n), [row for row in rows if row[s] == n], x, y) for n in names]
    return [_points(name, rows, x, cols.index(name)) for name in spec["y"]]


def _points(label: str, rows, x: int, y: int) -> tuple[str, list[float], list[float]]:
    pairs = [(number(row[x]), number(row[y])) for row in rows]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    return label, [a for a, _ in pairs], [b for _, b in pairs]


def diff(path: Path, want: str) -> list[str]:
    have = path.read_text() if path.is_file() else ""
    return list(difflib.unified_diff(have.splitlines(), want.splitlines(), str(path), "rendered", lineterm="", n=1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a page differs from what it renders")
    ap.add_argument("--results", type=Path, default=ROOT / "docs" / "results", help="the results folder")
    ap.add_argument("--page", type=Path, default=ROOT / "docs" / "performance.md")
    ap.add_argument("--readme", type=Path, default=ROOT / "README.md")
    args = ap.parse_args(argv)
    try:
        by_kind = load_all(args.results)
        page = performance_md(by_kind, args.results)
        readme = with_readme_section(args.readme.read_text(), readme_section(by_kind))
    except (BadInput, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plots = [(r, args.results / r.kind / f"{r.benchmark}.png") for rs in by_kind.values() for r in rs if r.plot]
    if args.check:
        problems = diff(args.page, page) + diff(args.readme, readme)
        problems += [f"missing plot {png}: render without --check" for _, png in plots if not png.is_file()]
        for line in problems:
            print(line)
        if problems:
            print("docs differ from docs/results/: run python scripts/render_performance.py", file=sys.stderr)
        return 1 if problems else 0
    args.page.write_text(page)
    args.readme.write_text(readme)
    for r, png in plots:
        draw(r, png)
    print(f"wrote {args.page}, {args.readme} and {len(plots)} plots from {sum(map(len, by_kind.values()))} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
