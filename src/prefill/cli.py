"""The command line: thin. It parses, calls the library, and prints; the work happens elsewhere.

Each command lives in this file as a small function; errors a user can meet become one line and exit 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from prefill.errors import PrefillError

app = typer.Typer(
    name="prefill",
    help="See, measure and predict LLM prefill: cost model, engine, proofs, benchmark, server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int = 2) -> None:
    """Print one error line and exit with `code`: never a traceback."""
    err_console.print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(code)


# ---- commands are added below this line (one function each) ----


def main() -> None:
    """Console-script entry point: run the app, turning our errors into one line and exit code 2."""
    try:
        app()
    except (PrefillError, ValueError, FileNotFoundError) as e:
        err_console.print(f"[bold red]error:[/] {e}", highlight=False)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
