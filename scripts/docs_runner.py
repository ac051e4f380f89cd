"""Running the docs' commands: a scratch folder, bash or the CLI in-process, a server per page, and the
check of a command that is not run (its program and options exist)."""

from __future__ import annotations

import ast
import contextlib
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
from pathlib import Path

from docs_blocks import ROOT, Example, shown

COLUMNS = "120"  # wide enough for `prefill run`'s tables, narrow enough to read on the docs site
DOC_PORT = re.compile(r"127\.0\.0\.1:(\d+)|localhost:(\d+)")


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
