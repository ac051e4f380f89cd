"""F32 and BF16 GGUFs of exactly a GGUF's own weights: the fair llama.cpp peer.

The embedded SmolLM2 GGUF stores most matrices as Q4_1 blocks; we and transformers run them dequantized in
float32 or bfloat16. To compare llama.cpp like for like, this writes the same dequantized tensors as an F32 or
a BF16 GGUF with the `gguf` package: every metadata key copied (tokenizer, chat template, shapes, rotary),
general.file_type set to the new type, tensors in the source's order, names and layout (llama.cpp's rotary row
order kept: it is llama.cpp that reads the file). 1-D tensors (the norms) stay F32 in the BF16 file, as
llama.cpp's own converter writes them. Files are cached in prefill.device.cache.cache_dir()/gguf, keyed by the
source's name, size and modification time.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from prefill.errors import ModelFileError

# llama.cpp's LLAMA_FTYPE values written to general.file_type
FILE_TYPES = {"float32": 0, "bfloat16": 32}
_SKIPPED_KEYS = ("GGUF.", "general.architecture", "general.file_type", "general.alignment")


def dense_gguf_name(source: str | Path, dtype: str) -> str:
    """The `dtype` copy's file name: the source's model name and llama.cpp's tag (SmolLM2-135M-Instruct.F32.gguf),
    so that the copy is named as its source is (costmodel.specs.gguf_model_name reads a GGUF's name off its file)."""
    from prefill.costmodel.specs import gguf_model_name

    return f"{gguf_model_name(Path(source))}.{ {'float32': 'F32', 'bfloat16': 'BF16'}[dtype] }.gguf"


def dense_gguf_path(source: str | Path, dtype: str) -> Path:
    """Where the `dtype` copy of `source` is (or will be) cached: a folder per version of the source file."""
    from prefill.device.cache import cache_dir

    src = Path(source).resolve()
    st = src.stat()
    return cache_dir() / "gguf" / f"{src.stem}-{st.st_size}-{int(st.st_mtime)}" / dense_gguf_name(src, dtype)


def dense_gguf(source: str | Path, dtype: str, out: str | Path | None = None) -> Path:
    """The path of an F32 ("float32") or BF16 ("bfloat16") GGUF of `source`'s weights, written if missing."""
    if dtype not in FILE_TYPES:
        raise ModelFileError(f"a dense GGUF is float32 or bfloat16, not {dtype}")
    path = Path(out) if out is not None else dense_gguf_path(source, dtype)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        _write(Path(source), dtype, tmp)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def _write(source: Path, dtype: str, path: Path) -> None:
    import gguf
    from gguf.quants import dequantize, quantize

    from prefill.costmodel.gguf_file import open_gguf

    reader = open_gguf(source)
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(path, arch)
    for key, field in reader.fields.items():
        if key.startswith(_SKIPPED_KEYS):
            continue
        main = field.types[0]
        sub = field.types[-1] if main == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), main, sub_type=sub)
    writer.add_file_type(FILE_TYPES[dtype])
    F32, BF16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.BF16
    for t in reader.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]  # numpy order: [out, in]
        w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(shape)
        if dtype == "bfloat16" and len(shape) > 1:
            writer.add_tensor(t.name, quantize(w, BF16), raw_dtype=BF16)  # shape from the bytes: [out, 2 in]
        else:
            writer.add_tensor(t.name, w, raw_dtype=F32)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
