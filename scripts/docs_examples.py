"""Run the documentation's examples, so that what README.md and docs/ show is what the code does.

An example is a fenced block with a marker comment on the line above it:

    <!-- example -->                the block holds `$ COMMAND` lines, each followed by its output; the output
                                    must be the same text (timing-free commands: estimate, kv, mask, errors)
    <!-- example: varies -->        the output holds timings: the command must exit as shown, the text may differ
    <!-- example: slow -->          the command loads the model (with `varies` or not): checked by `--slow`
    <!-- example: exit=2 -->        the exit status the commands must end with (default 0)
    <!-- example: serve -->         the first line `$ prefill serve ...` starts a server (on a free port); the
                                    `$ curl ...` lines after it run against it (its doc port replaced)
    <!-- example: long -->          minutes-long commands (benchmarks): not run; each program must exist and take
                                    every option shown (`PROGRAM --help` lists them; `make -n TARGET` succeeds)

Flags combine: `<!-- example: varies slow -->`. Commands run through bash in a scratch folder holding a copy of
docs/examples/ (long ones are checked from the repository root), with the `prefill` of this Python's environment
first on PATH, COLUMNS=120 and a private PREFILL_CACHE_DIR. Besides the examples, the check refuses a `$ ` block
without a marker, a README link to a missing file or heading, a malformed external URL, and a backticked
`src/...`, `tests/...`, `benchmarks/...` path or `prefill.module.name` that does not exist.

    python scripts/docs_examples.py --check            # every example (slow ones load the model)
    python scripts/docs_examples.py --check --fast     # the torch-free and tokenizer-only ones (the test suite)
    python scripts/docs_examples.py --regenerate       # run every example and rewrite its block (not `long`)
"""

from __future__ import annotations

import argparse
import difflib
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from docs_blocks import Example, docs_files, find_examples, shown
from docs_lint import check_links, check_names
from docs_runner import Runner, check_long, run_example


def selected(example: Example, group: str) -> bool:
    slow = "slow" in example.flags or "serve" in example.flags
    return group == "all" or (group == "slow") == slow


def check_example(example: Example, runner: Runner) -> list[str]:
    """What is wrong with one example: an exit status or, for an exact one, text that differs."""
    if "long" in example.flags:
        return check_long(example, runner)
    problems = []
    for (command, expected), (_, got, code) in zip(example.steps, run_example(example, runner), strict=True):
        if code != example.exit_code:
            problems.append(f"{example.where}: `{command}` exited {code}, the docs say {example.exit_code}:\n{got}")
        elif "varies" not in example.flags and got != expected:
            diff = difflib.unified_diff(expected.splitlines(), got.splitlines(), "docs", "now", lineterm="")
            problems.append(f"{example.where}: `{command}` prints something else now:\n" + "\n".join(diff))
    return problems


def regenerate(path: Path, examples: list[Example], runner: Runner) -> int:
    """Rewrite each example block of one file with what its commands print now; the number of blocks rewritten.

    The commands run in document order (a page's server sees its requests in the order a reader sends them);
    the blocks are then replaced from the bottom, so that line numbers hold."""
    bodies = []
    for example in (e for e in examples if "long" not in e.flags):
        body = []
        for command, got, code in run_example(example, runner):
            if code != example.exit_code:
                raise SystemExit(f"{example.where}: `{command}` exited {code}, the marker says {example.exit_code}")
            body += [f"$ {command}", *(got.splitlines() if got else [])]
        bodies.append((example, body))
    lines, changed = path.read_text().splitlines(), 0
    for example, body in reversed(bodies):
        if lines[example.line : example.end - 1] != body:
            lines[example.line : example.end - 1] = body
            changed += 1
    path.write_text("\n".join(lines) + "\n")
    return changed


def check_file(path: Path, which: str, runner: Runner) -> tuple[list[str], int]:
    """Every check of one page: its problems, and the number of examples run."""
    examples, problems = find_examples(path)
    examples = [e for e in examples if selected(e, which)]
    if which == "slow":
        problems = []
    else:
        problems += check_links(path) + check_names(path, runner)
    try:
        for example in examples:
            problems += check_example(example, runner)
    finally:
        runner.stop_servers(path)
    return problems, len(examples)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--check", action="store_true", help="run the examples and compare")
    mode.add_argument("--regenerate", action="store_true", help="run the examples and rewrite their blocks")
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--fast", action="store_true", help="only examples that need no model (and the lint)")
    group.add_argument("--slow", action="store_true", help="only the examples that load the model")
    ap.add_argument("--jobs", type=int, default=3, help="pages checked at once (each page's examples in order)")
    ap.add_argument("files", nargs="*", type=Path, help="markdown files (default: README.md and docs/)")
    args = ap.parse_args(argv)
    which = "fast" if args.fast else "slow" if args.slow else "all"
    files = [p.resolve() for p in args.files] or docs_files()
    runner, problems, count = Runner(), [], 0
    try:
        if args.regenerate:  # one page after another: the outputs are reviewed as a diff
            for path in files:
                examples = [e for e in find_examples(path)[0] if selected(e, which)]
                print(f"{shown(path)}: {regenerate(path, examples, runner)} blocks rewritten")
                runner.stop_servers(path)
            return 0
        with ThreadPoolExecutor(max(1, args.jobs)) as pool:
            for found, n in pool.map(lambda path: check_file(path, which, runner), files):
                problems, count = problems + found, count + n
    finally:
        runner.close()
    for problem in problems:
        print(problem, file=sys.stderr)
    sys.stderr.flush()
    print(f"{count} examples checked ({which}) in {len(files)} files: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
