"""The rule `auto` follows (issue 51), on made-up quality records and predictions, never one machine's outcome:
an explicit option is honoured; a reduced-precision path is weighed only where measured near-lossless on the
file, and taken only where predicted at least MIN_GAIN faster than the exact path; unmeasured, auto stays exact
and says so. A path whose greedy text depends on the batch or the cache is never taken unasked (only_asked). The
choice among weighed paths is checked on a made-up 8-bit path auto could take (GATED_Q8)."""

from __future__ import annotations

from prefill.machine import paths
from prefill.machine.paths import MIN_GAIN, NATIVE, PathTime, ServingPath, Workload, asked, choose_path, gate_note
from prefill.machine.quality_gate import GATE, QualityRecord, file_identity, record_of, save_records

F32 = ServingPath(NATIVE, "float32")
Q8 = paths.PATHS[1]  # 8-bit activations: only where asked
GATED_Q8 = ServingPath(NATIVE, "float32", "q8")  # the rule's case: a reduced path auto may weigh
BF16 = paths.PATHS[2]  # dense bfloat16: only where asked
DENSE = ServingPath("float32", "float32")
# SmolLM2-135M's 8-bit activations as measured (docs/weights.md): top-1 97.13%, PPL ratio 1.0033
Q8_SMOLLM = QualityRecord(top1=0.9713, ppl_ratio=1.0033, mean_kl=2.93e-3, p99_kl=1.37e-2, tokens=10_240)
NEAR_LOSSLESS = QualityRecord(top1=0.9994, ppl_ratio=1.0000, mean_kl=6.3e-7, p99_kl=5.6e-6, tokens=10_240)


def t(path: ServingPath, total_s: float, w: Workload = Workload(100, 11)) -> PathTime:
    """A made-up prediction of `total_s` seconds for the whole request (all of it the TTFT)."""
    return PathTime(path, path.label(("Q4_1",)), total_s, 0.0, w)


def test_the_gate_is_the_issues_line():
    assert NEAR_LOSSLESS.passes()
    assert Q8_SMOLLM.failures() == ["top-1 97.13% < 99%", "PPL ratio 1.0033 beyond 1 ± 0.002", "p99 KL 0.0137 > 0.01"]
    edge = QualityRecord(top1=GATE.top1, ppl_ratio=1.0015, mean_kl=0, p99_kl=GATE.p99_kl, tokens=GATE.min_tokens)
    assert edge.passes()  # top-1, p99 KL and the length: each bound inclusive
    assert QualityRecord(0.999, 0.997, 0, 0, 10_240).failures() == ["PPL ratio 0.9970 beyond 1 ± 0.002"]  # both ways
    assert QualityRecord(1.0, 1.0, 0, 0, 512).failures() == ["measured on 512 tokens, fewer than 10,000"]


def test_exact_and_reduced_paths():
    assert F32.exact and DENSE.exact and not Q8.exact and not BF16.exact
    assert (Q8.reduced, BF16.reduced, F32.reduced) == ("8-bit activations", "dense bfloat16", "")
    assert Q8.key() == "native|float32|q8|kv float32" and Q8.key("float16") == "native|float32|q8|kv float16"
    assert BF16.key() == "bfloat16|bfloat16|f32|kv bfloat16"


def test_an_explicit_option_names_the_reduced_path_it_asks_for():
    assert asked(Q8, "auto", "auto", "q8") and not asked(Q8, "auto", "native", "auto")
    assert asked(BF16, "bf16", "auto") and asked(BF16, "auto", "bfloat16") and not asked(BF16, "auto", "auto")
    assert asked(F32, "auto", "auto")  # the exact path needs no gate


def test_an_explicit_float32_dtype_means_float32_activations():
    zen4 = paths.Capability("cpu", "AMD EPYC (Zen 4)", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16", "fma"}))
    q = ("Q4_1", "Q8_0")
    assert paths.candidates("float32", "auto", q, zen4, True) == [F32, DENSE]  # q8 is not float32 activations
    assert paths.candidates("float32", "auto", q, zen4, True, "q8") == [Q8]  # unless --activations q8 says so
    assert paths.candidates("auto", "auto", q, zen4, True) == [F32, Q8, BF16, DENSE]  # auto: the gate decides


def test_gate_note_says_why_a_path_is_left_out():
    assert gate_note("8-bit activations", None) == (
        "8-bit activations not measured near-lossless on this file; `prefill verify --quality` measures it"
    )
    assert gate_note("8-bit activations", Q8_SMOLLM).startswith("8-bit activations not near-lossless on this file: ")
    assert gate_note("float16 K/V", NEAR_LOSSLESS) == ""
    assert gate_note("dense bfloat16", NEAR_LOSSLESS, BF16) == (
        "dense bfloat16 only where asked: its greedy text changes on a prefix-cache hit"
    )  # not a path auto takes, whatever its record
    assert gate_note("8-bit activations", NEAR_LOSSLESS, Q8) == (
        "8-bit activations only where asked: its greedy text changes on a prefix-cache hit"
    )
    assert [p for p in paths.PATHS if p.auto] == [F32, DENSE]  # auto takes only batch- and cache-invariant paths


def test_auto_stays_exact_unless_a_gated_path_is_10_percent_faster():
    best, line = choose_path([t(F32, 1.00), t(GATED_Q8, 0.95)])  # 5% faster: speed under the margin buys nothing
    assert best.path == F32
    assert line.endswith(f"(under {MIN_GAIN:.0%} faster: 8-bit activations not taken)")
    assert choose_path([t(F32, 1.00), t(GATED_Q8, 0.90)])[0].path == GATED_Q8  # exactly 10% faster
    assert choose_path([t(F32, 1.00), t(GATED_Q8, 0.91)])[0].path == F32
    # the exact paths among themselves: the fastest, whatever the margin
    assert choose_path([t(F32, 1.00), t(DENSE, 0.99)])[0].path == DENSE
    # the reduced path is measured against the fastest exact path, not the first: 1.0 <= 0.9 x 1.2, > 0.9 x 1.05
    assert choose_path([t(F32, 2.00), t(GATED_Q8, 1.00), t(DENSE, 1.20)])[0].path == GATED_Q8
    assert choose_path([t(F32, 2.00), t(GATED_Q8, 1.00), t(DENSE, 1.05)])[0].path == DENSE
    assert choose_path([t(BF16, 1.0)])[0].path == BF16  # asked for, alone: honoured


def test_the_line_says_what_the_gate_left_out():
    shut = [gate_note("8-bit activations", None)]
    _, line = choose_path([t(F32, 1.0), t(DENSE, 2.0)], shut)
    assert line.startswith("path auto: native Q4_1 blocks, float32 activations, predicted 1.00 s")
    assert line.endswith(
        "(8-bit activations not measured near-lossless on this file; `prefill verify --quality` measures it)"
    )
    assert paths.exact_line("native Q4_1 blocks, float32 activations", shut) == (
        "path auto: native Q4_1 blocks, float32 activations (8-bit activations not measured near-lossless on this "
        "file; `prefill verify --quality` measures it)"
    )


def test_choose_kv_takes_a_gated_k_v_dtype_only_10_percent_faster():
    load = Workload(4096, 128)
    assert paths.choose_kv([("float32", 2.0), ("float16", 1.5)], load)[0] == "float16"
    kv, line = paths.choose_kv([("float32", 1.26), ("float16", 1.15)], load)
    assert kv == "float32" and line.endswith("(under 10% faster: K/V kept as float32)")
    kv, line = paths.choose_kv([("float32", 2.0)], load, [gate_note("float16 K/V", None)])
    assert kv == "float32" and line.endswith(
        "(float16 K/V not measured near-lossless on this file; `prefill verify --quality` measures it)"
    )


def test_records_are_cached_per_file_identity_and_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path / "cache"))
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(b"GGUF" + bytes(100))
    b.write_bytes(b"GGUF" + bytes(99) + b"\x01")  # the same size, other bytes: another file
    assert record_of(a, Q8.key()) is None  # never measured
    save_records(a, {Q8.key(): Q8_SMOLLM, F32.key("float16"): NEAR_LOSSLESS})
    assert record_of(a, Q8.key()) == Q8_SMOLLM and record_of(a, F32.key("float16")) == NEAR_LOSSLESS
    assert record_of(b, Q8.key()) is None and file_identity(a) != file_identity(b)
    moved = tmp_path / "elsewhere"
    moved.mkdir()
    (moved / "a.gguf").write_bytes(a.read_bytes())
    assert record_of(moved / "a.gguf", Q8.key()) == Q8_SMOLLM  # the bytes, not the place
    (tmp_path / "cache" / "quality.json").write_text("{not json")
    assert record_of(a, Q8.key()) is None  # a damaged cache is only a cache
