"""The hardware catalog, this machine's measured rates (through the machine probe), and the calibration file."""

import subprocess
import sys

import pytest

from prefill.costmodel import hardware
from prefill.costmodel.costs import (
    Calibration,
)
from prefill.costmodel.hardware import HARDWARE, calibration_path, get_hardware, load_calibration, save_calibration
from prefill.costmodel.roofline import (
    ridge_point,
)
from prefill.errors import BadInput


def test_catalog_has_the_required_entries_with_dense_datasheet_figures():
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l4", "rtx-4090", "mi300x"} <= set(HARDWARE)
    assert {"b200", "gb200", "h20", "mi325x"} <= set(HARDWARE)
    for hw in HARDWARE.values():
        assert {"float32", "bfloat16", "float16"} <= set(hw.peak_flops)
        assert hw.peak_flops["bfloat16"] > hw.peak_flops["float32"] > 0
        assert hw.bandwidth_bytes_per_s > 0 and hw.memory_bytes > 0 and hw.link_bytes_per_s > 0
        assert "datasheet" in hw.source or "whitepaper" in hw.source
        assert hw.compute_units in (58, 78, 108, 128, 132, 148, 304)  # SMs (MI300X, MI325X: compute units)


@pytest.mark.parametrize(
    "name, bf16_tflops, bandwidth_gb_s, memory_gb",
    [
        ("h100", 989.4, 3350, 80),
        ("h200", 989.4, 4800, 141),
        ("a100-40gb", 312, 1555, 40),
        ("a100-80gb", 312, 2039, 80),
        ("l4", 121, 300, 24),
        ("rtx-4090", 165.2, 1008, 24),
        ("mi300x", 1307.4, 5300, 192),
    ],
)
def test_datasheet_figures(name, bf16_tflops, bandwidth_gb_s, memory_gb):
    hw = get_hardware(name)
    assert hw.peak("bf16") == pytest.approx(bf16_tflops * 1e12)
    assert hw.bandwidth_bytes_per_s == pytest.approx(bandwidth_gb_s * 1e9)
    assert hw.memory_bytes == pytest.approx(memory_gb * 1e9)


def test_h100_ridge_point():
    hw = get_hardware("H100")
    assert ridge_point(hw.peak("bf16"), hw.bandwidth_bytes_per_s) == pytest.approx(295.3, abs=0.1)


def test_unknown_hardware_and_missing_dtype():
    with pytest.raises(BadInput, match="h100-sxm"):
        get_hardware("tpu-v5")
    with pytest.raises(BadInput, match="no peak for fp8"):
        get_hardware("a100").peak("fp8")


def test_catalog_lookup_imports_no_torch():
    code = "import sys, prefill.costmodel.hardware as h; h.get_hardware('h100'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_catalog_does_not_measure_this_cpu():
    import prefill
    from prefill.machine import probe, profiles

    assert prefill.measure_gemm_rate is probe.measure_gemm_rate
    assert prefill.get_hardware is profiles.get_hardware  # "cpu" resolves above the cost model
    with pytest.raises(BadInput, match="this machine"):
        get_hardware("cpu")
    with pytest.raises(AttributeError):
        hardware.this_cpu  # noqa: B018


def test_calibration_round_trip(tmp_path, monkeypatch):
    path = tmp_path / "cal.json"
    monkeypatch.setenv("PREFILL_CALIBRATION", str(path))
    assert calibration_path() == path
    assert load_calibration() is None
    cal = Calibration(0.002, 1.2e11, 4e10, "float32", 2, "bench on this machine")
    assert save_calibration(cal) == path
    assert load_calibration() == cal
    path.write_text("{broken")
    with pytest.raises(BadInput, match="delete it"):
        load_calibration()


def test_default_calibration_path(monkeypatch, tmp_path):
    monkeypatch.delenv("PREFILL_CALIBRATION", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert calibration_path() == tmp_path / ".cache" / "prefill" / "calibration.json"
