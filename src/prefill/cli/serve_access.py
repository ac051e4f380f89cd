"""Who may reach `prefill serve` and `prefill lab`: the API key (--api-key, PREFILL_API_KEY, --api-key-file), the
Host names answered (--allowed-hosts), and the warning printed when the server is reachable beyond this machine
without a key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from prefill.cli.common import fail, note

ApiKey = Annotated[
    str | None,
    typer.Option(
        envvar="PREFILL_API_KEY",
        show_envvar=True,
        help="require Authorization: Bearer KEY on /v1, /api, /metrics and the tokenizer routes (/health stays open)",
    ),
]
ApiKeyFile = Annotated[str | None, typer.Option(help="read the API key from this file (its first line)")]
AllowedHosts = Annotated[
    str | None,
    typer.Option(
        help="Host header names answered beside the loopback names and --host, comma-separated; -NAME removes one "
        "(-localhost), * allows any"
    ),
]
EXPOSED = "/v1 (generation on this machine's CPU), /api (the lesson's live model), /metrics and /tokenize"


def api_key_of(api_key: str | None, api_key_file: str | None) -> str | None:
    """The key from --api-key / PREFILL_API_KEY, or the first line of --api-key-file; None: no key."""
    if api_key is not None and api_key_file is not None:
        fail("give --api-key (or PREFILL_API_KEY) or --api-key-file, not both")
    if api_key_file is not None:
        try:
            lines = Path(api_key_file).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            fail(f"--api-key-file {api_key_file}: cannot read it ({e})")
        api_key = lines[0].strip() if lines else ""
        if not api_key:
            fail(f"--api-key-file {api_key_file} is empty: write the key on its first line")
    if api_key is not None and (not api_key or any(c.isspace() or not c.isprintable() for c in api_key)):
        fail("the API key must be non-empty printable text without spaces")
    return api_key


def hosts_of(allowed_hosts: str | None, host: str) -> tuple[str, ...]:
    """The Host names answered: the loopback names and the bound address (default_allowed_hosts), plus the names
    --allowed-hosts adds, less those it removes with a leading "-" ("a.example,-localhost"); "*" answers any."""
    from prefill.server.security import default_allowed_hosts

    hosts = default_allowed_hosts(host)
    if allowed_hosts is None:
        return hosts
    names = [h.strip().lower() for h in allowed_hosts.split(",") if h.strip()]
    if not names:
        fail("--allowed-hosts names no host; give one or more names, or * for any")
    removed = {n[1:].strip().strip("[]") for n in names if n.startswith("-")}
    if "" in removed:
        fail("--allowed-hosts: a lone '-' removes nothing; write -NAME, e.g. -localhost")
    added = [n.strip("[]") for n in names if not n.startswith("-")]
    kept = tuple(dict.fromkeys(h for h in (*hosts, *added) if h.strip("[]") not in removed))
    if not kept:
        fail("--allowed-hosts removes every host; keep at least one name, or give * for any")
    return kept


def warn_if_exposed(host: str, api_key: str | None, hosts: tuple[str, ...]) -> None:
    """A warning on stderr when the server binds beyond loopback without a key: anyone who reaches the port can
    use what EXPOSED lists."""
    from prefill.server.security import is_loopback

    if is_loopback(host):
        return
    if api_key is None:
        note(
            f"warning: --host {host} without --api-key: anyone who can reach this port can use {EXPOSED}; "
            "set --api-key KEY (or PREFILL_API_KEY)"
        )
    if "*" not in hosts and hosts == tuple(h for h in hosts if is_loopback(h)):
        note(
            f"note: only Host names {', '.join(hosts)} are answered (others get HTTP 400); pass --allowed-hosts "
            "with the names clients use to reach this machine"
        )
