"""Reading a GGUF file's metadata and tensor table (gguf's reader), once per load. No torch."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefill.costmodel.gguf_reader import reader_class
from prefill.errors import ModelFileError

_READERS: dict[tuple, Any] | None = None  # open_gguf's readers while a reading_once() scope is open


@contextmanager
def reading_once() -> Iterator[None]:
    """Inside this scope open_gguf parses each file once: loading a model asks for its metadata, tensor types and
    vocabulary from several places (a parse is ~60 ms for the embedded model here with gguf_reader's lazy arrays,
    and was 3.2 s with gguf's own reader). The readers are let go when the outermost scope ends."""
    global _READERS
    outer = _READERS is None
    if outer:
        _READERS = {}
    try:
        yield
    finally:
        if outer:
            _READERS = None


@contextmanager
def quick_gguf_parsing() -> Iterator[None]:
    """For code that reads GGUF files with gguf's own functions (transformers' GGUF loader, for the reference and
    the transformers peer): gguf.GGUFReader is reader_class() while the scope is open, and gguf's tensor-name table
    is built once per architecture instead of once per module. The same bytes are parsed by the same code, so
    what the caller gets is unchanged (bitwise, checked in the suite); the embedded model loads in transformers
    in 6 s instead of 29 s here (3 parses of 7 s, and the table built 397 times)."""
    import gguf

    saved = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader, gguf.get_tensor_name_map = reader_class(), functools.cache(gguf.get_tensor_name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = saved


def open_gguf(path: str | Path):
    """A gguf.GGUFReader over `path`, or a ModelFileError saying the file is missing, truncated or not GGUF."""
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"no GGUF file at {path}")
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if _READERS is not None and key in _READERS:
        return _READERS[key]
    try:
        reader = reader_class()(str(path))
        if _READERS is not None:
            _READERS[key] = reader
        return reader
    except Exception as e:  # the reader fails in many ways on a damaged file; all mean the same to a user
        raise ModelFileError(
            f"cannot read {path} as GGUF ({type(e).__name__}: {e}); "
            "the file is truncated or not GGUF: download it again"
        ) from None
