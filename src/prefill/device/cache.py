"""The machine's cache folder: probe profiles, fitted profiles and the bench's compile verdicts, one JSON file
each, keyed by what a measurement is valid for (machine_key: device, torch version, thread count)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from prefill.device.capability import capability


def cache_dir() -> Path:
    """$PREFILL_CACHE_DIR, else ~/.cache/prefill: the probe's profiles and the bench's compile verdicts live here."""
    env = os.environ.get("PREFILL_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "prefill"


def machine_key(device: str = "cpu", threads: int | None = None) -> str:
    """What a cached measurement is valid for: device name, torch version, thread count."""
    import torch

    cap = capability("cuda" if device.startswith("cuda") else "cpu")
    n = threads or (torch.get_num_threads() if cap.device == "cpu" else 1)
    return f"{cap.device}|{cap.name}|{cap.isa}|torch {torch.__version__}|{n} threads"


def read_json(name: str) -> dict:
    """A JSON file of cache_dir() as a dict ({} when missing or damaged: a cache is only a cache)."""
    try:
        return json.loads((cache_dir() / name).read_text())
    except (OSError, ValueError):
        return {}


def write_json(name: str, data: dict) -> None:
    """Write a JSON file of cache_dir(), quietly giving up where the folder is not writable."""
    try:
        cache_dir().mkdir(parents=True, exist_ok=True)
        tmp = cache_dir() / f".{name}.{os.getpid()}"
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        tmp.replace(cache_dir() / name)
    except OSError:
        pass
