"""The engines a user would pick instead, run on the same weights, tokens, dtype and thread count as ours.

- transformers: `AutoModelForCausalLM` from the same GGUF (dequantized to dense weights) or the same HF folder,
  SDPA attention, the same dtype, `logits_to_keep=1` so it too unembeds only the last position.
- llama.cpp through `llama-cpp-python` (optional extra `prefill[llamacpp]`): the same GGUF in its own quantized
  types; `llm.eval(tokens)` after `llm.reset()` is its prefill.
Each peer exposes `prefill(ids)` for one whole prefill of a [1, P] prompt (a list of ids or a LongTensor) and
`peak(ids)` for its memory. `prefill bench` runs each in a child process (prefill.bench.peer_process), built by
the module-level loaders below, so a peer that crashes becomes a row that says so, not the benchmark's end.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from prefill.bench.peer_process import PeerCrashed, PeerFailed, PeerProcess
from prefill.bench.results import LLAMA_DENSE, BenchConfig, BenchResult, Crash
from prefill.bench.timing import measure_peak_memory, time_interleaved
from prefill.errors import BadInput, ModelFileError

PEER_NAMES = ("transformers", "llamacpp")


@dataclass
class TransformersPeer:
    """Hugging Face transformers, SDPA attention, in `dtype`; `prefill(ids)` runs one forward pass."""

    model: Any  # transformers PreTrainedModel
    dtype: str
    device: str = "cpu"
    name: str = "transformers"
    version: str = field(default="", init=False)

    def __post_init__(self) -> None:
        import transformers

        self.version = transformers.__version__
        self.model.eval()

    @classmethod
    def load(cls, model_path: str | Path, dtype: str, device: str = "cpu") -> TransformersPeer:
        """Load from a .gguf file (dequantized to dense `dtype` weights) or an HF model folder."""
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        from prefill.costmodel.gguf_file import quick_gguf_parsing

        hf_logging.set_verbosity_error()  # its load-time advice and progress bars would bury our tables
        hf_logging.disable_progress_bar()
        torch_dtype = _torch_dtype(dtype)
        path = Path(model_path)
        kwargs: dict[str, Any] = {"dtype": torch_dtype, "attn_implementation": "sdpa"}
        if path.suffix == ".gguf":
            kwargs.update(gguf_file=path.name, quantization_config=_dense_gguf_config())
            path = path.parent
        elif not (path / "config.json").is_file():
            raise ModelFileError(f"{model_path}: the transformers peer needs a .gguf file or an HF model folder")
        with contextlib.redirect_stderr(io.StringIO()), quick_gguf_parsing():  # its dequantizer draws a raw tqdm bar
            model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs).to(device)
        dtypes = {str(p.dtype).removeprefix("torch.") for p in model.parameters()}
        if dtypes != {dtype}:
            raise ModelFileError(
                f"transformers loaded {model_path} with weights in {sorted(dtypes)}, not dense {dtype}: "
                "the comparison would not be like for like"
            )
        return cls(model=model, dtype=dtype, device=device)

    def prefill(self, ids: Any) -> Any:
        """One prefill of `ids` (a list of P ids, or LongTensor [1, P] on the peer's device); returns the
        last-position logits [1, V]."""
        import torch

        if not torch.is_tensor(ids):
            ids = torch.tensor([list(ids)], device=self.device)  # [1, P]
        with torch.inference_mode():
            out = self.model(ids, logits_to_keep=1, use_cache=True)
        return out.logits[:, -1]  # [1, vocab]

    def peak(self, ids: Any):
        """The PeakMemory of one prefill of `ids` (prefill.bench.timing)."""
        import torch

        with torch.inference_mode():
            return measure_peak_memory(lambda: self.prefill(ids), self.device)


@dataclass
class LlamaCppPeer:
    """llama.cpp via llama-cpp-python on a GGUF, in the file's own (quantized) types."""

    llm: Any  # llama_cpp.Llama
    n_batch: int
    name: str = "llamacpp"
    dtype: str = "gguf"
    version: str = ""

    @classmethod
    def load(
        cls,
        gguf_path: str | Path,
        n_ctx: int,
        threads: int,
        n_batch: int = 512,
        logits_all: bool = False,
        extra_bufts: bool = True,
    ) -> LlamaCppPeer:
        """Open `gguf_path` with room for `n_ctx` tokens, `threads` threads, micro-batches of `n_batch`; with
        `logits_all`, every position's logits are kept (logits(), for the quality table). `extra_bufts` False:
        llama.cpp's extra buffer types (its weight repacking, AMX's among them) off, as where they crash."""
        if not llamacpp_available():
            raise BadInput("llama-cpp-python is not installed: pip install 'prefill[llamacpp]'")
        if Path(gguf_path).suffix != ".gguf":
            raise BadInput(f"the llama.cpp peer needs a .gguf file, got {gguf_path}")
        import llama_cpp

        batch = min(n_batch, n_ctx)
        with contextlib.nullcontext() if extra_bufts else _model_params(use_extra_bufts=False):
            llm = llama_cpp.Llama(
                model_path=str(gguf_path),
                n_ctx=n_ctx,
                n_threads=threads,
                n_threads_batch=threads,
                n_batch=batch,
                n_ubatch=batch,
                logits_all=logits_all,
                verbose=False,
            )
        return cls(llm=llm, n_batch=batch, version=llama_cpp.__version__)

    def prefill(self, ids: list[int]) -> None:
        """One prefill of `ids` from an empty KV cache."""
        self.llm.reset()
        self.llm.eval(ids)

    def peak(self, ids: list[int]):
        """The PeakMemory of one prefill of `ids` (prefill.bench.timing)."""
        return measure_peak_memory(lambda: self.prefill(ids))

    def logits(self, ids: list[int], lo: int, hi: int):
        """float32 logits [hi - lo, vocab] of positions lo .. hi-1 of one prefill of `ids` from an empty cache
        (a peer loaded with logits_all)."""
        import numpy as np

        self.prefill(ids)
        return np.array(self.llm.scores[lo:hi], dtype=np.float32)

    def fill(self, ids: list[int]) -> None:
        """Prefill `ids` as the context that step() then decodes after."""
        self.prefill(ids)
        self._context = list(ids)

    def step(self) -> None:
        """One decode step after fill()'s context: back to that context first, so the step writes position S
        again (as ours does) and the context stays S tokens."""
        self.llm.n_tokens = len(self._context)
        self.llm.eval([self._context[-1]])


@contextlib.contextmanager
def _model_params(**fields):
    """llama-cpp-python's Llama() sets its llama_model_params from llama_model_default_params() and takes no
    argument for some of their fields (use_extra_bufts, in 0.3.36): within the block, those defaults carry
    `fields`. Only ever in a peer's own child process, around its one load."""
    import llama_cpp.llama_cpp as lib

    missing = set(fields) - {name for name, _ in lib.llama_model_params._fields_}
    if missing:
        raise BadInput(f"this llama-cpp-python's model params have no {sorted(missing)}: upgrade it")
    default = lib.llama_model_default_params

    def params():
        p = default()
        for k, v in fields.items():
            setattr(p, k, v)
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = default


def load_llamacpp_child(
    path: str, n_ctx: int, threads: int, name: str = "llamacpp", dtype: str = "gguf", extra_bufts: bool = True
):
    """A child's LlamaCppPeer (prefill.bench.peer_process builds peers with a module-level function)."""
    peer = LlamaCppPeer.load(path, n_ctx=n_ctx, threads=threads, extra_bufts=extra_bufts)
    return replace(peer, name=name, dtype=dtype)


def load_llamacpp_scorer(path: str, n_ctx: int, threads: int):
    """A child's LlamaCppPeer that keeps every position's logits (the quality table's llama.cpp row)."""
    return LlamaCppPeer.load(path, n_ctx=n_ctx, threads=threads, n_batch=n_ctx, logits_all=True)


def load_transformers_child(path: str, dtype: str, device: str = "cpu", threads: int | None = None):
    """A child's TransformersPeer, with `threads` torch threads (the benchmark's own count)."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    return TransformersPeer.load(path, dtype, device)


def llamacpp_available() -> bool:
    """True when `llama_cpp` (llama-cpp-python) can be imported."""
    return importlib.util.find_spec("llama_cpp") is not None


def parse_peers(text: str) -> tuple[str, ...]:
    """'transformers,llamacpp' -> ('transformers', 'llamacpp'); '' or 'none' -> ()."""
    names = tuple(p.strip().lower() for p in text.split(",") if p.strip())
    if names in ((), ("none",)):
        return ()
    unknown = [n for n in names if n not in PEER_NAMES]
    if unknown:
        raise BadInput(f"unknown peer {', '.join(unknown)}: choose from {', '.join(PEER_NAMES)}")
    return names


def _torch_dtype(dtype: str) -> Any:
    import torch

    table = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in table:
        raise BadInput(f"dtype {dtype!r} is not one of {', '.join(table)}")
    return table[dtype]


def _dense_gguf_config() -> Any:
    # Newer transformers keep GGUF blocks packed when a kernel exists; ask for dense weights explicitly.
    try:
        from transformers import GgufConfig
    except ImportError:
        return None
    return GgufConfig(dequantize=True)


def transformers_version() -> str | None:
    """The installed transformers version, or None."""
    try:
        import transformers
    except ImportError:
        return None
    return transformers.__version__


def llamacpp_version() -> str | None:
    if not llamacpp_available():
        return None
    import llama_cpp

    return llama_cpp.__version__


# ---- the peers of one sweep ---------------------------------------------------------------------------


def load_transformers_peer(config: BenchConfig, model_path: str, dtype: str, threads: int, notes: list[str]):
    """transformers on the same weights in `dtype`, in a child process (PeerProcess); a Crash if the child died
    while loading; None when not asked for, not installed, or failing to load (said in `notes`)."""
    if "transformers" not in config.peers:
        return None
    if transformers_version() is None:
        notes.append("transformers peer skipped: transformers is not installed")
        return None
    kwargs = {"path": model_path, "dtype": dtype, "device": config.device, "threads": threads}
    return start_peer(load_transformers_child, kwargs, "transformers", dtype, notes)


def start_peer(factory, kwargs: dict, name: str, dtype: str, notes: list[str]):
    """PeerProcess(factory, kwargs, name, dtype); a Crash when its child died while loading; None with a note
    when the peer raised there."""
    try:
        return PeerProcess(factory, kwargs, name, dtype)
    except PeerCrashed as e:
        return Crash(name, dtype, None, e.reason, e.log_path, e.log)
    except PeerFailed as e:
        notes.append(f"{name} ({dtype}) could not load: {e}")
    return None


def dense_dtypes(config: BenchConfig, model_path: str) -> tuple[str, ...]:
    """The dtypes whose like-for-like llama.cpp peer (an F32 / BF16 GGUF of the same weights) can run."""
    from prefill.bench.dense_gguf import FILE_TYPES

    if "llamacpp" not in config.peers or not config.llama_dense or not model_path.endswith(".gguf"):
        return ()
    return tuple(dt for dt in config.dtypes if dt in FILE_TYPES)


def load_llamacpp_peers(
    config: BenchConfig, model_path: str, dtype: str, first: bool, n_ctx: int, threads: int, notes: list[str]
) -> list:
    """llama.cpp on the GGUF's own types (once per run, with the first dtype) and on the `dtype` copy, each a
    PeerProcess, or a Crash where its child died while loading."""
    if "llamacpp" not in config.peers:
        return []
    if not llamacpp_available():
        if first:
            notes.append("llama.cpp peer skipped: llama-cpp-python is not installed (pip install 'prefill[llamacpp]')")
        return []
    if not model_path.endswith(".gguf") or config.device != "cpu":
        if first:
            notes.append("llama.cpp peer skipped: it needs a .gguf model on the CPU")
        return []
    from prefill.bench.dense_gguf import dense_gguf

    args = {"n_ctx": n_ctx, "threads": threads}
    peers = [start_peer(load_llamacpp_child, {"path": model_path, **args}, "llamacpp", "gguf", notes)] if first else []
    if dtype in dense_dtypes(config, model_path):
        dense = {"path": str(dense_gguf(model_path, dtype)), "name": LLAMA_DENSE, "dtype": dtype, **args}
        peers.append(start_peer(load_llamacpp_child, dense, LLAMA_DENSE, dtype, notes))
    return [p for p in peers if p is not None]


def alive_peers(peers: list, result: BenchResult) -> list:
    """The peers whose child loaded; a Crash among them goes to result.crashes (with its note), a None away."""
    for crash in (p for p in peers if isinstance(p, Crash)):
        result.crashes.append(crash)
        result.notes.append(crash.note())
    return [p for p in peers if p is not None and not isinstance(p, Crash)]


def time_point(runs: dict, peers: list, dtype: str, P: int, config: BenchConfig, result: BenchResult):
    """time_interleaved over `runs`, and each run's peak memory; a peer whose child dies meanwhile is recorded
    as a Crash, closed, dropped from `runs` and `peers`, and the point measured again without it."""
    import torch

    while True:
        try:
            with torch.inference_mode():  # no autograd bookkeeping for any engine's calls
                timings = time_interleaved(runs, repeats=config.repeats, warmup=config.warmup, device=config.device)
                memory = {key: measure_peak_memory(fn, device=config.device) for key, fn in runs.items()}
            return timings, memory
        except PeerCrashed as e:
            crash = Crash(e.name, dtype, P, e.reason, e.log_path, e.log)
            result.crashes.append(crash)
            result.notes.append(crash.note())
            dead = [p for p in peers if p.name == e.name]
            for p in dead:
                p.close()
                peers.remove(p)
                runs.pop((p.name, p.dtype), None)
