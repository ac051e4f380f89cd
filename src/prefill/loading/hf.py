"""A Hugging Face model folder: config.json + *.safetensors (sharded too) + tokenizer.json."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch

from prefill.errors import ModelFileError


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of a folder: the shards named by model.safetensors.index.json, or every *.safetensors."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as e:
            raise ModelFileError(f"{index} is not a safetensors index: {e}") from None
        files = [folder / f for f in sorted(set(weight_map.values()))]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFileError(f"{folder} has no *.safetensors weights")
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ModelFileError(f"{folder} lacks the weight shards {', '.join(missing)}")
    return files


def load_safetensors_state_dict(
    folder: Path, dtype: torch.dtype, progress: Callable[[int, int], None] | None = None
) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's safetensors files, cast to `dtype`."""
    from safetensors import SafetensorError
    from safetensors.torch import safe_open

    files = safetensors_files(folder)
    sd: dict[str, torch.Tensor] = {}
    for i, path in enumerate(files):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    sd[name] = f.get_tensor(name).to(dtype)
        except (SafetensorError, OSError) as e:
            raise ModelFileError(f"cannot read {path} (truncated or not safetensors): {e}") from None
        if progress:
            progress(i + 1, len(files))
    return sd


def eos_ids_from_config(folder: Path) -> set[int]:
    """End-of-sequence ids from config.json and generation_config.json (an int or a list in either)."""
    ids: set[int] = set()
    for name in ("config.json", "generation_config.json"):
        path = folder / name
        if path.exists():
            value = json.loads(path.read_text()).get("eos_token_id")
            ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return ids
