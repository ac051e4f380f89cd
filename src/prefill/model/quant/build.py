"""Build the engine's C++ kernels into one library that torch loads: `python -m prefill.model.quant.build`.

Its sources: the quantized GEMM (float32 and 8-bit activations, csrc/q8.cpp) and fused block operators (csrc/,
torch.ops.prefill_quant) and the model's own kernels (prefill/model/csrc/: the paged attention and the
batch-invariant linear, torch.ops.prefill_kernels).

`make install` runs it; the engine also builds on first need when the library is missing or stale. The
library's name carries a digest of the sources, the torch version and the flags, so an edited kernel or another
torch never loads an old build. It is written beside this file when the package folder is writable (an editable
install), else under the cache folder (prefill.device.cache.cache_dir). No compiler (or PREFILL_NO_COMPILER=1,
how the tests force it): nothing is built, and the engine runs its portable path with a one-line note.

The flags come from torch.utils.cpp_extension (torch's headers, libraries and C++ ABI); no -march: the SIMD
paths carry their own target attributes and are chosen at run time, so one build runs on any x86-64 CPU.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CSRC = Path(__file__).parent / "csrc"
MODEL_CSRC = Path(__file__).parent.parent / "csrc"
SOURCES = (
    CSRC / "gemm.cpp",
    CSRC / "q8.cpp",
    CSRC / "kquants.cpp",
    CSRC / "fused.cpp",
    MODEL_CSRC / "paged_attention.cpp",
    MODEL_CSRC / "linear.cpp",
)
FLAGS = (
    "-O3",
    "-std=c++20",  # torch 2.13's headers use C++20 (bit-field initializers)
    "-ffp-contract=off",
    "-shared",
    "-fPIC",
    "-fopenmp",
    "-fvisibility=hidden",
    "-Wall",
    "-Wno-unused-function",
)
NO_COMPILER_ENV = "PREFILL_NO_COMPILER"


def compiler() -> str | None:
    """The C++ compiler to use ($CXX, else c++ or g++ on PATH), or None (none found, or PREFILL_NO_COMPILER set)."""
    if os.environ.get(NO_COMPILER_ENV):
        return None
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return shutil.which("c++") or shutil.which("g++")


def _torch_flags() -> list[str]:
    import torch
    from torch.utils import cpp_extension

    flags = [f"-I{p}" for p in cpp_extension.include_paths()]
    flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}")
    for lib in cpp_extension.library_paths():
        flags += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    return flags + ["-lc10", "-ltorch_cpu", "-ltorch"]


def library_name() -> str:
    """File name of the library these sources build with this torch: _prefill_quant_<digest>.so."""
    import torch

    h = hashlib.sha256(torch.__version__.encode() + " ".join(FLAGS).encode())
    for folder in (CSRC, MODEL_CSRC):
        for f in sorted(folder.iterdir()):
            if f.suffix in (".cpp", ".h"):
                h.update(f.name.encode() + f.read_bytes())
    return f"_prefill_quant_{h.hexdigest()[:16]}.so"


def _folders() -> list[Path]:
    from prefill.device.cache import cache_dir

    return [Path(__file__).parent, cache_dir() / "kernels"]


def find_library() -> Path | None:
    """The built library for the current sources and torch, if one exists."""
    for folder in _folders():
        path = folder / library_name()
        if path.is_file():
            return path
    return None


def build(cxx: str | None = None) -> Path:
    """Compile the kernels and return the library's path (atomically renamed into place, so concurrent builds
    are harmless). Raises RuntimeError with the compiler's last lines when compiling fails."""
    cxx = cxx or compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX, or install g++)")
    for folder in _folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
        except OSError:
            continue
        os.close(fd)
        try:
            _compile_and_link(cxx, tmp)
        except RuntimeError:
            os.unlink(tmp)
            raise
        path = folder / library_name()
        os.replace(tmp, path)
        _remove_stale(folder, keep=path)
        return path
    raise RuntimeError(f"no writable folder for the kernels among {', '.join(map(str, _folders()))}")


def _compile_and_link(cxx: str, out: str) -> None:
    """Compile every source to an object file at once (one process each: the build takes as long as the largest
    file, not their sum), then link them into `out`. RuntimeError with the compiler's last lines on failure."""
    with tempfile.TemporaryDirectory() as objdir:
        objects = [str(Path(objdir) / f"{src.stem}.o") for src in SOURCES]
        includes = [f for f in _torch_flags() if f.startswith(("-I", "-D"))]
        flags = [f for f in FLAGS if f != "-shared"]
        jobs = [
            subprocess.Popen([cxx, *flags, "-c", str(src), "-o", obj, *includes], stderr=subprocess.PIPE, text=True)
            for src, obj in zip(SOURCES, objects, strict=True)
        ]
        # Every compiler ends before a failure is raised (none is left writing into the folder being removed);
        # one after another, each drains its own pipe, so none can block the rest.
        errors = [job.communicate()[1] for job in jobs]
        for job, stderr in zip(jobs, errors, strict=True):
            _check("compiling", job.returncode, stderr)
        done = subprocess.run([cxx, *FLAGS, *objects, "-o", out, *_torch_flags()], capture_output=True, text=True)
        _check("linking", done.returncode, done.stderr)


def _check(step: str, returncode: int, stderr: str) -> None:
    if returncode != 0:
        tail = "\n".join(stderr.strip().splitlines()[-15:])
        raise RuntimeError(f"{step} the quantized kernels failed:\n{tail}")


def _remove_stale(folder: Path, keep: Path) -> None:
    for old in folder.glob("_prefill_quant_*.so"):
        if old != keep:
            old.unlink(missing_ok=True)


def main() -> int:
    """Build if needed and say what happened in one line; never fails the install (the portable path runs)."""
    found = find_library()
    if found is not None:
        print(f"quantized kernels: up to date ({found})")
        return 0
    cxx = compiler()
    if cxx is None:
        print("quantized kernels: no C++ compiler, not built; native GGUF weights will run the slower portable path")
        return 0
    t = time.perf_counter()
    try:
        path = build(cxx)
    except RuntimeError as e:
        print(f"quantized kernels: {e}\nnot built; native GGUF weights will run the slower portable path")
        return 0
    print(f"quantized kernels: built {path} in {time.perf_counter() - t:.0f} s with {cxx}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
