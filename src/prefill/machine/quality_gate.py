"""The quality gate: whether a reduced-precision path is near-lossless on one model file, measured once per file
and path against the float32 reference (`prefill verify --quality`: prefill.bench.quality) and cached on disk
beside the machine probe. `auto` weighs a reduced-precision path only where its record here passes
(prefill.machine.paths.choose_path); where none was ever measured it stays exact and says so.

Near-lossless, the project's line (issue 51): on a held-out text of at least MIN_TOKENS tokens, against float32
activations and float32 K/V on the same file,

    top-1 agreement >= 99%,   |perplexity ratio - 1| <= 0.002,   p99 KL <= 0.01 nats.

On the embedded SmolLM2-135M Q4_1 file 8-bit activations miss it (top-1 97.1%, ratio 1.0033; docs/weights.md)
and float16 K/V pass it (99.94%, 1.0000, p99 5.6e-6): a 135M model's near-tie tokens flip where a larger one's
do not, which is why the gate is measured on the file itself.

    GATE                          the line (Gate)
    QualityRecord                 one path's figures on one file; .failures() says what breaks the line
    file_identity(path)           what records are keyed by: the file's name, size and a digest of its head and tail
    save_records(model, records)  cache a file's records (quality.json), replacing that file's older ones
    record_of(model, key)         the cached record of one path on one file, or None where never measured
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from prefill.device.cache import read_json, write_json

QUALITY_FILE = "quality.json"  # the gate's records, per model file identity and path key
GATE_VERSION = 1  # records of another version are measured again
HEAD_BYTES = 1 << 20  # bytes read at each end of a file for its identity


@dataclass(frozen=True)
class Gate:
    """What near-lossless means: the least top-1 agreement, the most perplexity drift |ratio - 1|, the most p99
    KL (nats), over a held-out text of at least `min_tokens` tokens."""

    top1: float = 0.99
    ppl_drift: float = 0.002
    p99_kl: float = 0.01
    min_tokens: int = 10_000


GATE = Gate()


@dataclass(frozen=True)
class QualityRecord:
    """One path's figures against float32 on one file: top-1 agreement (0..1), perplexity ratio, mean and p99 KL
    (nats), over a text of `tokens` tokens; `cpu` the CPU kind it was measured on."""

    top1: float
    ppl_ratio: float
    mean_kl: float
    p99_kl: float
    tokens: int
    cpu: str = ""

    def failures(self, gate: Gate = GATE) -> list[str]:
        """The measures that break `gate`, in words (empty: near-lossless)."""
        broken = []
        if self.tokens < gate.min_tokens:
            broken.append(f"measured on {self.tokens:,} tokens, fewer than {gate.min_tokens:,}")
        if self.top1 < gate.top1:
            broken.append(f"top-1 {self.top1:.2%} < {gate.top1:.0%}")
        if abs(self.ppl_ratio - 1) > gate.ppl_drift:
            broken.append(f"PPL ratio {self.ppl_ratio:.4f} beyond 1 ± {gate.ppl_drift:g}")
        if self.p99_kl > gate.p99_kl:
            broken.append(f"p99 KL {self.p99_kl:.3g} > {gate.p99_kl:g}")
        return broken

    def passes(self, gate: Gate = GATE) -> bool:
        return not self.failures(gate)


def file_identity(path: str | Path) -> str:
    """A model file's (or Hugging Face folder's) identity: its name, size and a digest of its first and last MiB
    (of each file, in a folder), so a record follows the file's bytes and not where it lies."""
    p = Path(path)
    files = sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p]
    stats = tuple((str(f), f.stat().st_size, f.stat().st_mtime_ns) for f in files)
    return _identity(p.name, stats)


@functools.cache
def _identity(name: str, stats: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for file, size, _ in stats:  # the mtime only keys this memo: a file rewritten in place is read again
        with open(file, "rb") as f:
            digest.update(f"{Path(file).name}:{size}:".encode() + f.read(HEAD_BYTES))
            if size > 2 * HEAD_BYTES:
                f.seek(size - HEAD_BYTES)
                digest.update(f.read(HEAD_BYTES))
    return f"{name}|{sum(s for _, s, _ in stats)}|{digest.hexdigest()[:16]}"


def save_records(model: str | Path, records: dict[str, QualityRecord]) -> None:
    """Cache `records` (path key -> figures; prefill.machine.paths.ServingPath.key) of the file at `model`,
    replacing the file's earlier records."""
    data = read_json(QUALITY_FILE)
    data[file_identity(model)] = {
        "file": Path(model).name,
        "version": GATE_VERSION,
        "measured": time.strftime("%Y-%m-%d %H:%M:%S"),
        "records": {key: asdict(r) for key, r in records.items()},
    }
    write_json(QUALITY_FILE, data)


def record_of(model: str | Path, key: str) -> QualityRecord | None:
    """The cached record of path `key` on the file at `model`, or None where it was never measured (or by
    another version of the gate, or the cache is damaged: a cache is only a cache)."""
    entry = read_json(QUALITY_FILE).get(file_identity(model), {})
    if not isinstance(entry, dict) or entry.get("version") != GATE_VERSION:
        return None
    try:
        return QualityRecord(**entry["records"][key])
    except (KeyError, TypeError):
        return None
