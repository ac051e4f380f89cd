"""--dtype auto: the choice from faked capabilities and rates (never from timings), the cache, the warning."""

import pytest

from prefill.device.capability import Capability, cpu_flags
from prefill.errors import BadInput
from prefill.machine import native
from prefill.machine.native import choose

AVX2 = Capability("cpu", "AMD EPYC (AVX2 only)", "AVX2", frozenset({"avx2", "fma"}))
ZEN4 = Capability("cpu", "AMD EPYC 9004", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16"}))
# The formatter is off for the tables in this file alone: they read better aligned.
# fmt: off
SPR = Capability("cpu", "Intel Xeon 8480", "AVX512", frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile",
                                                                 "amx_bf16", "avx512_fp16"}))
# fmt: on
H200 = Capability("cuda", "NVIDIA H200", "CUDA sm_90", cuda_bf16=True)
# The AVX2 machine: float32 110 GFLOP/s, bfloat16 0.3 GFLOP/s.
AVX2_RATES = {"float32": 110e9, "bfloat16": 0.3e9, "float16": 0.2e9}


def test_kinds_and_native_dtypes():
    assert (AVX2.kind, AVX2.native_dtypes()) == ("AVX2", ("float32",))
    assert (ZEN4.kind, ZEN4.native_dtypes()) == ("AVX512-BF16", ("float32", "bfloat16"))
    assert (SPR.kind, SPR.native_dtypes()) == ("AMX", ("float32", "bfloat16", "float16"))
    assert (H200.kind, H200.native_dtypes()) == ("CUDA", ("float32", "bfloat16", "float16"))
    assert Capability("cuda", "Tesla T4", "CUDA sm_75").native_dtypes() == ("float32", "float16")


def test_auto_on_avx2_is_float32_and_says_why():
    c = choose("auto", AVX2, AVX2_RATES)
    assert c.dtype == "float32" and c.warning is None
    assert c.reason == "dtype auto: float32 (this CPU (AVX2) has no AMX-BF16 or AVX-512-BF16; GEMM probe 110 GFLOP/s)"


@pytest.mark.parametrize("cap", [ZEN4, SPR])
def test_auto_on_bf16_hardware_is_bfloat16(cap):
    c = choose("auto", cap, {"float32": 130e9, "bfloat16": 400e9})
    assert c.dtype == "bfloat16" and c.warning is None
    assert "this CPU has" in c.reason and "BF16" in c.reason and "GEMM probe 400 GFLOP/s" in c.reason


def test_auto_on_cuda_needs_no_probe():
    c = choose("auto", H200, None)
    assert c.dtype == "bfloat16" and "tensor cores" in c.reason


def test_native_bf16_that_is_no_faster_loses_to_float32():
    # An AVX-512-BF16 Xeon without AMX: VDPBF16PS at the FP32 FMA rate, so bf16 GEMMs are no faster.
    xeon = Capability("cpu", "Intel Xeon (AMX hidden)", "AVX512", frozenset({"avx512f", "avx512_bf16"}))
    c = choose("auto", xeon, {"float32": 160e9, "bfloat16": 150e9})
    assert c.dtype == "float32"
    assert "bfloat16 is native (this CPU has AVX-512-BF16) but no faster here: 150 vs 160 GFLOP/s" in c.reason
    assert choose("auto", xeon, {"float32": 100e9, "bfloat16": 130e9}).dtype == "bfloat16"  # 1.3x: worth it


def test_explicit_emulated_dtype_runs_with_the_measured_rates_in_the_warning():
    c = choose("bf16", AVX2, AVX2_RATES)
    assert c.dtype == "bfloat16"
    assert c.warning.startswith("bfloat16 is emulated on this CPU (this CPU (AVX2) has no AMX-BF16 or AVX-512-BF16)")
    assert "0.3 GFLOP/s vs 110 in float32" in c.warning
    assert choose("float16", ZEN4, {"float32": 100e9, "float16": 2e9}).warning.startswith("float16 is emulated")


def test_explicit_native_dtype_has_no_warning():
    assert choose("float32", AVX2, AVX2_RATES).warning is None
    assert choose("bfloat16", ZEN4, {}).warning is None


def test_unknown_dtype_is_bad_input():
    with pytest.raises(BadInput, match="unknown dtype"):
        choose("float64x", ZEN4, {})


def test_cpu_flags_keeps_only_the_matrix_flags():
    text = "processor: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512_bf16 amx_tile amx_bf16 sha_ni\n"
    assert cpu_flags(text) == {"avx2", "fma", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
    assert cpu_flags("no flags line") == frozenset()


def test_resolve_prints_the_reason_and_warns_once(monkeypatch):
    monkeypatch.setattr(native, "capability", lambda device="cpu": AVX2)
    monkeypatch.setattr(native, "gemm_rates", lambda device="cpu", dtypes=(), **kw: {d: AVX2_RATES[d] for d in dtypes})
    monkeypatch.setattr(native, "_WARNED", set())
    lines = []
    assert native.resolve_dtype("auto", echo=lines.append) == "float32"
    assert native.resolve_dtype("bf16", echo=lines.append) == "bfloat16"
    assert native.resolve_dtype("bfloat16", echo=lines.append) == "bfloat16"
    assert len(lines) == 2 and lines[0].startswith("dtype auto: float32")
    assert lines[1].startswith("warning: bfloat16 is emulated") and "0.3 GFLOP/s vs 110" in lines[1]


def test_compile_verdict_is_saved_per_machine_and_dtype(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFILL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(native, "machine_key", lambda device="cpu", threads=None: "cpu|test machine")
    assert native.compile_verdict("float32") is None
    assert native.keep_compile("float32", echo=None)  # never measured: do as asked
    native.save_compile_verdict(native.CompileVerdict("float32", 512, eager_tok_s=440, compiled_tok_s=374))
    native.save_compile_verdict(native.CompileVerdict("bfloat16", 512, eager_tok_s=900, compiled_tok_s=1100))
    lines = []
    assert not native.keep_compile("fp32", echo=lines.append)
    assert native.keep_compile("bf16", echo=lines.append)
    assert lines == [
        "compiling was slower here (374 vs 440 tok/s at P = 512 in the last bench, float32); running eager",
        "compiling pays here (1,100 vs 900 tok/s at P = 512 in the last bench, bfloat16)",
    ]
