"""The app itself: every command short, user errors one line and exit 2 in-process too, demo without --chat."""

import inspect

import pytest
from typer.testing import CliRunner

from prefill.cli import engine as cli_engine
from prefill.cli.main import COMMANDS, app

runner = CliRunner()


def test_every_command_parses_calls_and_prints_in_at_most_40_lines():
    for command in COMMANDS:
        lines, _ = inspect.getsourcelines(command)
        assert len(lines) <= 40, f"{command.__module__}.{command.__name__}: {len(lines)} lines"


@pytest.mark.parametrize(
    "args, needle",
    [
        (["run", "hi", "--top-p", "0"], "top_p"),
        (["run", "hi", "--model", "/nonexistent/model.gguf"], "not found"),
        (["run", "hi", "--model", "/tmp"], "config.json"),
        (["run", "hi", "--dtype", "fp7"], "dtype"),
        (["run", "hi", "--kv-dtype", "int4"], "unknown K/V dtype 'int4'"),
        (["serve", "--kv-dtype", "fp8"], "unknown K/V dtype 'fp8'"),
        (["run", "hi", "--max-new-tokens", "-1"], "--max-new-tokens"),
        (["run", "hi", "--chat", "--raw"], "contradict"),
        (["score", "/no/such/file.txt"], "cannot read"),
        (["serve", "--kv-cache-mb", "0"], "--kv-cache-mb must be > 0"),
        (["bench", "--prompt-lengths", "32,x"], "--prompt-lengths"),
        (["loadtest", "--prompt-len", "20:10"], "lo <= hi"),
        (["exercise", "check", "/no/such/solution.py"], "does not exist"),
    ],
)
def test_user_errors_are_one_line_and_exit_2_before_any_model_loads(args, needle):
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert not isinstance(result.exception, Exception)  # only the SystemExit of a clean exit
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], result.stderr


class NoTemplateEngine:
    """Stands in for a loaded model without a chat template; records what generate was asked."""

    tokenizer = None
    source = "no-template.gguf"
    kv_store = None

    def __init__(self):
        self.asked = {}

    def generate(self, prompt, **kw):
        self.asked = {"prompt": prompt, **kw}
        return iter(())


@pytest.fixture
def fake_engine(monkeypatch):
    engine = NoTemplateEngine()
    monkeypatch.setattr(cli_engine, "load_engine", lambda *args, **kw: engine)
    monkeypatch.setattr("prefill.cli.report.show_run", lambda console, engine, events, chunk_size: None)
    return engine


def test_demo_is_run_without_chat_so_a_model_without_template_runs_raw(fake_engine):
    result = runner.invoke(app, ["demo"])
    assert result.exit_code == 0, result.output  # a truthy OptionInfo for chat would refuse the model here
    assert "no chat template, so the prompt runs raw" in result.stdout
    assert fake_engine.asked["prompt"] == cli_engine.DEMO_PROMPT and fake_engine.asked["max_new_tokens"] == 32
    assert fake_engine.asked["chunk_size"] is None and fake_engine.asked["stop"] == ()


def test_run_with_chat_refuses_a_model_without_template(fake_engine):
    result = runner.invoke(app, ["run", "hi", "--chat"])
    assert result.exit_code == 2
    assert "no-template.gguf has no chat template: drop --chat" in result.stderr
    assert fake_engine.asked == {}  # refused before generating
