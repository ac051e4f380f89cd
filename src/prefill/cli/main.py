"""The command line, assembled: one typer app over the command modules of prefill.cli.

Each command parses its options, calls one function and prints (calc: estimate, kv, mask; bench; calibrate;
serve: serve, lab; loadtest; simulate; plan; engine: run, demo, verify; score; exercise). Every command is wrapped by
`user_errors`, so an error a user can meet is one `error:` line and exit code 2, never a traceback.
"""

from __future__ import annotations

import typer

from prefill.cli import bench, calc, calibrate, engine, exercise, loadtest, plan, score, serve, simulate
from prefill.cli.common import user_errors

app = typer.Typer(
    name="prefill",
    help="See, measure and predict LLM prefill: cost model, engine, proofs, benchmark, server.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

COMMANDS = (
    calc.estimate,
    calc.kv,
    calc.mask,
    bench.bench,
    calibrate.calibrate,
    serve.serve,
    loadtest.loadtest,
    simulate.simulate,
    plan.plan,
    engine.run,
    engine.demo,
    engine.verify,
    serve.lab,
    score.score,
)  # in the order `prefill --help` lists them
for command in COMMANDS:
    app.command()(user_errors(command))
app.add_typer(exercise.app, name="exercise")


def main() -> None:
    """The console script `prefill`."""
    app()
