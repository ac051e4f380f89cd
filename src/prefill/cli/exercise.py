"""`prefill exercise`: the lesson's coding exercise, written to a file and checked locally."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefill.cli.common import console, user_errors

app = typer.Typer(help="The lesson's coding exercise: write five functions, check them locally.")


@app.callback(invoke_without_command=True)
@user_errors
def exercise(
    ctx: typer.Context,
    out: Annotated[str, typer.Option("--out", "-o", help="where to write the skeleton")] = "prefill_exercise.py",
    force: Annotated[bool, typer.Option("--force", help="overwrite an existing file")] = False,
) -> None:
    """Write the five empty functions to a file; then `prefill exercise check FILE`."""
    from prefill.lesson.exercise import write_skeleton

    if ctx.invoked_subcommand is not None:
        return
    path = write_skeleton(Path(out), force)
    console.print(f"wrote {path}: fill in the five functions, then run `prefill exercise check {path}`")


@app.command("check")
@user_errors
def check(file: Annotated[str, typer.Argument(help="your solution, a .py file")]) -> None:
    """Run the project's checks against the five functions in FILE; exit 1 if any fails."""
    from prefill.lesson.exercise import load_solution, run_checks

    checks = run_checks(load_solution(Path(file)))
    for c in checks:
        mark = "[green]PASS[/]" if c.ok else "[red]FAIL[/]"
        console.print(f"{mark} {c.function}: {c.name}" + (f" ({c.detail})" if c.detail else ""), highlight=False)
    passed = sum(c.ok for c in checks)
    console.print(f"{passed} of {len(checks)} checks pass", highlight=False)
    if passed < len(checks):
        raise typer.Exit(1)
