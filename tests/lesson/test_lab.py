"""`prefill lab` opens the page once the server answers, and says so when no browser can be opened."""

from __future__ import annotations

import webbrowser

import pytest
from fastapi import FastAPI

from prefill.lesson.lab import open_when_up
from prefill.server.server import BackgroundServer


@pytest.fixture(scope="module")
def url():
    app = FastAPI()
    app.get("/")(lambda: {"ok": True})
    with BackgroundServer(app) as root:
        yield root + "/"


@pytest.mark.parametrize("browser", [True, False, "error"])
def test_opens_the_page_or_reports_that_it_could_not(monkeypatch, url, browser):
    seen, results = [], []

    def fake_open(u):
        seen.append(u)
        if browser == "error":
            raise webbrowser.Error("no runnable browser")
        return browser

    monkeypatch.setattr(webbrowser, "open", fake_open)
    open_when_up(url, results.append, timeout_s=10).join(timeout=15)
    assert seen == [url]
    assert results == [browser is True]


def test_lab_and_exercise_are_commands():
    from typer.testing import CliRunner

    from prefill.cli.main import app

    runner = CliRunner()
    lab = runner.invoke(app, ["lab", "--help"])
    assert lab.exit_code == 0 and "--no-open" in lab.output
    ex = runner.invoke(app, ["exercise", "--help"])
    assert ex.exit_code == 0 and "check" in ex.output
