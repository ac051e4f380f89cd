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
import ast
import contextlib
import difflib
import io
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
COLUMNS = "120"  # wide enough for `prefill run`'s tables, narrow enough to read on the docs site
MARKER = re.compile(r"^<!--\s*example(?::\s*(?P<flags>[^>]*?))?\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)")
FLAGS = {"varies", "slow", "serve", "long"}
DOC_PORT = re.compile(r"127\.0\.0\.1:(\d+)|localhost:(\d+)")


@dataclass
class Example:
    """One marked block: where it is, its flags and the (command, output) pairs it shows."""

    path: Path
    line: int  # 1-based line of the opening fence
    end: int  # 1-based line of the closing fence
    fence: str
    info: str
    flags: set[str]
    exit_code: int
    columns: int | None = None  # the terminal width the commands see, when not COLUMNS
    steps: list[tuple[str, str]] = field(default_factory=list)

    @property
    def where(self) -> str:
        return f"{shown(self.path)}:{self.line}"


def shown(path: Path) -> str:
    """A path as messages print it: relative to the repository when inside it."""
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def docs_files() -> list[Path]:
    """README.md and every page of the site."""
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "examples" not in p.parts)]


def parse_flags(text: str | None) -> tuple[set[str], int, int | None]:
    """`varies slow exit=2 columns=160` -> ({'varies', 'slow'}, 2, 160); unknown words are an error."""
    flags, code, columns = set(), 0, None
    for word in (text or "").split():
        if word.startswith("exit="):
            code = int(word[5:])
        elif word.startswith("columns="):
            columns = int(word[8:])
        elif word in FLAGS:
            flags.add(word)
        else:
            raise ValueError(f"unknown example flag {word!r} (known: {', '.join(sorted(FLAGS))}, exit=N, columns=N)")
    return flags, code, columns


def split_steps(body: list[str], long: bool) -> list[tuple[str, str]]:
    """A block's lines as (command, output): `$ ` starts a command (a trailing backslash continues it)."""
    steps: list[tuple[str, list[str]]] = []
    lines = iter(body)
    for line in lines:
        stripped = line.strip()
        is_command = line.startswith("$ ") or (long and stripped and not stripped.startswith("#"))
        if not is_command:
            if steps:
                steps[-1][1].append(line)
            continue
        command = line[2:] if line.startswith("$ ") else line
        while command.rstrip().endswith("\\"):
            command = command.rstrip()[:-1] + " " + next(lines, "").strip()
        steps.append((command.strip(), []))
    return [(cmd, "\n".join(out).rstrip()) for cmd, out in steps]


def find_examples(path: Path) -> tuple[list[Example], list[str]]:
    """The marked blocks of one file, and the problems found (a marker with no block, a `$ ` block unmarked)."""
    lines = path.read_text().splitlines()
    examples, problems, i = [], [], 0
    rel = shown(path)
    while i < len(lines):
        marker, fence = MARKER.match(lines[i]), FENCE.match(lines[i])
        if marker:
            j = i + 1
            if j >= len(lines) or not FENCE.match(lines[j]):
                problems.append(f"{rel}:{i + 1}: an example marker must sit on the line above a fenced block")
                i += 1
                continue
            flags, code, columns = parse_flags(marker.group("flags"))
            example = read_block(path, lines, j, flags, code)
            example.columns = columns
            examples.append(example)
            i = example.end
        elif fence:
            block = read_block(path, lines, i, set(), 0)
            if any(line.startswith("$ ") for line in lines[i + 1 : block.end - 1]):
                problems.append(f"{rel}:{i + 1}: a `$ ` command block without an <!-- example --> marker above it")
            i = block.end
        else:
            i += 1
    return examples, problems


def read_block(path: Path, lines: list[str], start: int, flags: set[str], code: int) -> Example:
    """The fenced block opening at index `start` (0-based)."""
    fence = FENCE.match(lines[start]).group("fence")
    end = start + 1
    while end < len(lines) and not lines[end].startswith(fence):
        end += 1
    example = Example(path, start + 1, end + 1, fence, lines[start][len(fence) :], flags, code)
    example.steps = split_steps(lines[start + 1 : end], "long" in flags)
    return example


# ---- running ----------------------------------------------------------------------------------------------


class Runner:
    """Runs commands in one scratch folder (docs/examples/ copied in), one server per serve command and page."""

    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="prefill-docs-"))
        if (ROOT / "docs" / "examples").is_dir():
            shutil.copytree(ROOT / "docs" / "examples", self.scratch, dirs_exist_ok=True)
        bin_dir = str(Path(sys.executable).parent)
        self.env = {
            **os.environ,
            "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            "COLUMNS": COLUMNS,
            "NO_COLOR": "1",
            "TERM": "dumb",
            "PREFILL_CACHE_DIR": str(self.scratch / ".cache"),
        }
        self.servers: dict[tuple[Path, str], tuple[subprocess.Popen, int, int, str]] = {}  # by (page, command)
        self.memo: dict[tuple[str, Path, int | None], tuple[int, str]] = {}  # a command shown twice runs once
        self._cli_lock = threading.Lock()  # in-process runs share sys.argv, sys.stdout and the working folder
        os.environ.update({k: self.env[k] for k in ("COLUMNS", "NO_COLOR", "TERM", "PREFILL_CACHE_DIR")})

    def shell(
        self,
        command: str,
        cwd: Path | None = None,
        memo: bool = True,
        in_process: bool = True,
        columns: int | None = None,
    ) -> tuple[int, str]:
        """bash -c COMMAND: (exit status, what a terminal shows of stdout and stderr together). `memo`: reuse an
        earlier identical run; `in_process`: run a plain `prefill ...` command through the entry point in this
        process; `columns`: another terminal width (in a process of its own)."""
        key = (command, cwd or self.scratch, columns)
        if memo and key in self.memo:
            return self.memo[key]
        argv = in_process_argv(command) if in_process and columns is None else None
        if argv is not None:
            self.memo[key] = self.run_cli(argv, cwd or self.scratch)
            return self.memo[key]
        env = self.env if columns is None else {**self.env, "COLUMNS": str(columns)}
        r = subprocess.run(
            ["bash", "-o", "pipefail", "-c", command],
            cwd=cwd or self.scratch,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=900,
        )  # bytes: text mode would turn a progress bar's carriage returns into new lines
        self.memo[key] = r.returncode, as_displayed(r.stdout.decode("utf-8", errors="replace"))
        return self.memo[key]

    def run_cli(self, argv: list[str], cwd: Path) -> tuple[int, str]:
        """`prefill ARGS` in this process, through the console script's entry point: what a subprocess would
        print, without starting Python and importing the CLI again (the torch-free commands answer in ms)."""
        from importlib.metadata import entry_points

        (entry,) = entry_points(group="console_scripts", name="prefill")
        main = entry.load()
        out = io.StringIO()  # stdout and stderr in one, in the order they were written, as in a terminal
        with self._cli_lock, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            old_argv, old_cwd, code = sys.argv, os.getcwd(), 0
            sys.argv = ["prefill", *argv[1:]]
            os.chdir(cwd)
            try:
                main()
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            finally:
                sys.argv = old_argv
                os.chdir(old_cwd)
        return code, as_displayed(out.getvalue())

    def serve(self, command: str, page: Path) -> tuple[int, int, str]:
        """Start `prefill serve ...` once per page on a free port: (its doc port, the real port, what it printed)."""
        if (page, command) not in self.servers:
            argv = shlex.split(command.rstrip("& "))
            doc_port = int(argv[argv.index("--port") + 1]) if "--port" in argv else 8000
            if "--port" in argv:
                del argv[argv.index("--port") : argv.index("--port") + 2]
            port = free_port()
            proc = subprocess.Popen(
                [*argv, "--port", str(port)],
                cwd=self.scratch,
                env=self.env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            try:
                banner = wait_until_healthy(proc, port)
            except BaseException:
                proc.kill()
                raise
            self.servers[page, command] = (proc, doc_port, port, banner.replace(str(port), str(doc_port)))
        _, doc_port, port, banner = self.servers[page, command]
        return doc_port, port, banner

    def stop_servers(self, page: Path | None = None) -> None:
        """End the servers of one page (or all): each page starts its own, so its examples see a fresh one."""
        for key in [k for k in self.servers if page is None or k[0] == page]:
            proc = self.servers.pop(key)[0]
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()

    def close(self) -> None:
        self.stop_servers()
        shutil.rmtree(self.scratch, ignore_errors=True)


def as_displayed(text: str) -> str:
    """What a terminal shows of a program's output: a line rewritten with carriage returns (a progress bar)
    keeps only its last state, trailing spaces and blank lines at the end go."""
    lines = [line.rsplit("\r", 1)[-1].rstrip() for line in text.replace("\r\n", "\n").split("\n")]
    return "\n".join(lines).strip("\n")


def in_process_argv(command: str) -> list[str] | None:
    """The argv of a plain `prefill ...` command (no pipe, redirection or variable), which can run in-process."""
    if any(ch in command for ch in "|<>;&$`\\"):
        return None
    argv = shlex.split(command)
    return argv if argv and argv[0] in ("prefill", ".venv/bin/prefill") else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until_healthy(proc: subprocess.Popen, port: int, timeout: float = 300) -> str:
    """Block until GET /health answers 200; what the server printed until then (its start-up lines)."""
    import httpx

    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True).start()  # drains the pipe to the end
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}: {''.join(lines)[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return "".join(line for line in list(lines) if not line.startswith("INFO:")).strip("\n")
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server gave no healthy /health within {timeout:.0f} s")


def run_example(example: Example, runner: Runner) -> list[tuple[str, str, int]]:
    """Run every command of one block: (command, output as the docs would show it, exit status)."""
    results, port = [], None
    for command, _ in example.steps:
        if "serve" in example.flags and command.startswith("prefill serve"):
            _, port, banner = runner.serve(command, example.path)
            results.append((command, banner, 0))
            continue
        if "serve" in example.flags and port is None:
            raise ValueError(f"{example.where}: a serve example starts with `$ prefill serve ...`")
        if port:  # against this page's server: every request really sent, in order
            code, out = runner.shell(DOC_PORT.sub(f"127.0.0.1:{port}", command), memo=False, in_process=False)
        else:  # a command that loads the model runs as its own process (threads, memory), like a user's
            code, out = runner.shell(command, in_process="slow" not in example.flags, columns=example.columns)
        results.append((command, out, code))
    return results


def check_long(example: Example, runner: Runner) -> list[str]:
    """A minutes-long command is not run: its program must exist and accept every option the docs show."""
    return [p for command, _ in example.steps for p in check_command(command, example.where, runner)]


def check_command(command: str, where: str, runner: Runner) -> list[str]:
    """One command checked without running it: `cd` into a folder that exists, `make -n TARGET`, or every
    --option shown listed by the program's --help."""
    argv = shlex.split(command.rstrip("& "), comments=True)
    if not argv:
        return []
    if argv[0] == "cd":
        return [] if (ROOT / argv[1]).is_dir() else [f"{where}: `cd {argv[1]}`: no such folder in the repository"]
    if argv[0] == "make":
        code, out = runner.shell(f"make -n {shlex.join(argv[1:])}", cwd=ROOT)
    else:
        code, out = program_help(argv, runner)
    if code != 0:
        return [f"{where}: `{command}`: the program does not answer ({out[-300:]})"]
    options = (a.split("=")[0] for a in split_program(argv)[1] if a.startswith("-") and a != "-")
    return [
        f"{where}: `{command}`: {option} is not an option of {argv[0]}"
        for option in options
        if not re.search(rf"(?<![\w-]){re.escape(option)}(?![\w-])", out)
    ]


def split_program(argv: list[str]) -> tuple[list[str], list[str]]:
    """`python -m mod args`, `python script.py args` or `program args`: (the program, its arguments)."""
    python = argv[0].endswith("python") or argv[0] == "python3"
    n = 3 if python and argv[1:2] == ["-m"] else 2 if python else 1
    return argv[:n], argv[n:]


def program_help(argv: list[str], runner: Runner) -> tuple[int, str]:
    """`PROGRAM [SUBCOMMAND] --help`; for a script or module that takes no options, that it parses or imports."""
    program, rest = split_program(argv)
    if program[0].endswith("prefill"):
        sub = [a for a in rest if not a.startswith("-")][:1]
        sub += ["check"] if sub == ["exercise"] and "check" in rest else []
        return runner.shell(shlex.join([*program, *sub, "--help"]), cwd=ROOT)
    if program[0] == "lm_eval":  # its options are listed by `lm_eval run --help` (the legacy form runs `run`)
        sub = rest[:1] if rest[:1] in (["run"], ["ls"], ["validate"]) else ["run"]
        return runner.shell(shlex.join([*program, *sub, "--help"]), cwd=ROOT)
    if not any(a.startswith("-") for a in rest):
        if program[1:2] == ["-m"]:
            probe = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({program[2]!r}) is None)"
            return runner.shell(shlex.join([sys.executable, "-c", probe]), cwd=ROOT)
        script = ROOT / program[-1]
        if not script.is_file():
            return 1, f"{program[-1]} not found"
        check = ["bash", "-n"] if script.suffix == ".sh" else [sys.executable, "-m", "py_compile"]
        return runner.shell(shlex.join([*check, str(script)]), cwd=ROOT)
    if program[-1].endswith(".py"):  # its argparse options, read from the source: no torch imported
        return argparse_options(ROOT / program[-1])
    return runner.shell(shlex.join([*program, "--help"]), cwd=ROOT)


def argparse_options(script: Path) -> tuple[int, str]:
    """The option strings of every `add_argument(...)` call in a script, as one text (status 1 if none)."""
    if not script.is_file():
        return 1, f"{shown(script)} not found"
    calls = [n for n in ast.walk(ast.parse(script.read_text())) if isinstance(n, ast.Call)]
    options = [
        a.value
        for c in calls
        if getattr(c.func, "attr", "") == "add_argument"
        for a in c.args
        if isinstance(a, ast.Constant) and str(a.value).startswith("-")
    ]
    return (0, " ".join(options)) if options else (1, f"{shown(script)} takes no --options")


# ---- the other checks: links and names --------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
BARE_URL = re.compile(r"(?<![(\[\"'`])\bhttps?://[^\s)>\]`\"']+")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
REPO_PATH = re.compile(r"^(src|tests|benchmarks|docs|scripts)/[\w./-]+$")
DOTTED = re.compile(r"^prefill(\.[A-Za-z_]\w*)+$")
INLINE_COMMAND = re.compile(r"^(prefill [a-z]+|make [a-z-]+$)[^|<>`]*$")


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (lower case, punctuation dropped, spaces to hyphens)."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading).strip().lower()
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def anchors(path: Path) -> set[str]:
    text = strip_code(path.read_text())
    return {github_slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.*?)\s*#*\s*$", text, re.M)}


def strip_code(text: str) -> str:
    """The text without fenced blocks (links and headings in them are not links and headings)."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if m and fence is None:
            fence = m.group("fence")
        elif fence and line.startswith(fence):
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def check_links(path: Path) -> list[str]:
    """External links well-formed; in the README, relative links name a file of the repository (and heading)."""
    problems, rel, text = [], shown(path), strip_code(path.read_text())
    for target in [m.group(1) for m in LINK.finditer(text)] + BARE_URL.findall(text):
        if target.startswith(("http://", "https://")):
            url = urlparse(target)
            if not url.netloc or " " in target or not re.match(r"^[\w.-]+(:\d+)?$", url.netloc):
                problems.append(f"{rel}: malformed URL {target!r}")
        elif target.startswith("mailto:"):
            continue
        elif path.name == "README.md":  # the docs' own links are mkdocs --strict's to check
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists() or ROOT not in dest.parents and dest != ROOT:
                problems.append(f"{rel}: link {target!r} points to no file of the repository")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{rel}: link {target!r}: no heading #{anchor} in {file or rel}")
    return problems


def check_names(path: Path, runner: Runner) -> list[str]:
    """Backticked repository paths and `prefill.x.y` names must exist (they go stale when code moves), and an
    inline `prefill COMMAND --option` or `make TARGET` must name a command and options that exist."""
    problems, rel = [], shown(path)
    for span in CODE_SPAN.findall(strip_code(path.read_text())):
        span = span.strip()
        if INLINE_COMMAND.match(span):
            problems += check_command(span, rel, runner)
        elif REPO_PATH.match(span) and not any(ch in span for ch in "*<>") and "..." not in span:
            if not (ROOT / span.rstrip("/")).exists():
                problems.append(f"{rel}: `{span}` does not exist")
        elif DOTTED.match(span) and not resolves(span):
            problems.append(f"{rel}: `{span}` names no module or definition under src/")
    return problems


def resolves(dotted: str) -> bool:
    """`prefill.engine.loop.StepLoop.add`: the longest module prefix is a file, and each rest name is defined."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = ROOT / "src" / Path(*parts[:cut])
        module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
        if module.is_file():
            source = module.read_text()
            return all(
                re.search(rf"^\s*(def|class)\s+{n}\b|^\s*{n}\s*[:=]|\b{n}\b.*import|import.*\b{n}\b", source, re.M)
                for n in parts[cut:]
            )
    return False


# ---- check and regenerate ---------------------------------------------------------------------------------


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
