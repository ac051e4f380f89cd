"""Blackwell and FP4 in the catalog and the step model: NVFP4 and MXFP4 weights cost their 4 bits and their block
scales, run at the FP4 peak where the GPU has FP4 tensor cores and are refused in one line where it has none; a
Blackwell GEMM reaches its measured fraction of the peak; the new catalog entries carry their datasheet figures.
Worked numbers, no timing."""

import pytest

from prefill.costmodel import costs, storage
from prefill.costmodel.engines import ENGINES, activation_dtype, get_engine
from prefill.costmodel.hardware import HARDWARE, get_hardware
from prefill.costmodel.specs import PRESETS
from prefill.costmodel.timemodel import predict_decode
from prefill.errors import BadInput
from prefill.loadtest.client import PromptLengths
from prefill.plan.capacity import Workload
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.planner import Load, Slo, plan_deployments

L70 = PRESETS["llama-3-70b"]
B200 = get_hardware("b200")
TRT = get_engine("trtllm")


def test_fp4_weights_count_their_block_scales():
    # NVFP4: 16 E2M1 values (8 bytes) and one FP8 E4M3 scale; MXFP4: 32 values (16 bytes) and one E8M0 scale
    assert costs.dtype_bytes("nvfp4") == (16 * 4 + 8) / 16 / 8 == 0.5625  # 4.5 bits
    assert costs.dtype_bytes("MXFP4") == (32 * 4 + 8) / 32 / 8 == 0.53125  # 4.25 bits
    assert storage.weight_bytes(L70, "nvfp4") == pytest.approx(L70.N * 0.5625, rel=1e-9)
    assert activation_dtype("nvfp4") == activation_dtype("fp8") == "bfloat16"
    assert activation_dtype("float16") == "float16"


@pytest.mark.parametrize("name", ["b200", "gb200"])
def test_fp4_runs_at_the_fp4_peak_on_blackwell(name):
    hw = get_hardware(name)
    assert (
        hw.peak("nvfp4") == hw.peak("mxfp4") == pytest.approx(2 * hw.peak("fp8")) == pytest.approx(4 * hw.peak("bf16"))
    )


@pytest.mark.parametrize("name", ["h100", "h200", "h20", "mi300x", "mi325x", "a100"])
def test_a_gpu_without_fp4_tensor_cores_refuses_fp4_weights_in_one_line(name):
    with pytest.raises(BadInput, match="no FP4 tensor cores .*b200"):
        get_hardware(name).peak("nvfp4")
    with pytest.raises(BadInput, match="FP4"):
        GpuServer.of(PRESETS["llama-3.1-8b"], name, "vllm", "nvfp4")


def test_an_fp4_decode_step_reads_fp4_bytes_and_its_gemms_run_at_the_fp4_peak():
    f8, f4 = TRT.profile(B200, "fp8"), TRT.profile(B200, "nvfp4")
    one_f8 = predict_decode(L70, [100], f8, TRT.layout("fp8")).by_op()["gate_up"]
    one_f4 = predict_decode(L70, [100], f4, TRT.layout("nvfp4")).by_op()["gate_up"]
    assert one_f4.weight_bytes == pytest.approx(one_f8.weight_bytes * 0.5625)
    assert f4.gemm_rate(8192, 8192, 8192) == pytest.approx(2 * f8.gemm_rate(8192, 8192, 8192))
    assert f4.attention_peak() == pytest.approx(f8.attention_peak())  # attention stays BF16
    lay = TRT.layout("nvfp4")
    assert (lay.weight_bytes, lay.act_bytes, lay.kv_bytes) == (0.5625, 2, 2)


def test_fp4_weights_leave_more_kv_cache_and_fp4_kv_is_refused():
    # 70B in NVFP4 is 39.7 GB: one B200 holds it with ~125 GB of FP8 K/V, where FP8 weights leave ~95 GB
    f4 = GpuServer.of(L70, "b200", "trtllm", "nvfp4", "fp8", 1)
    f8 = GpuServer.of(L70, "b200", "trtllm", "fp8", "fp8", 1)
    per_position = 2 * L70.L * L70.H_kv * L70.d_head  # bytes of one position's K and V in FP8
    freed = 0.9 * (storage.weight_bytes(L70, "fp8") - storage.weight_bytes(L70, "nvfp4"))  # trtllm: 90% of free
    assert (f4.tokens - f8.tokens) * per_position == pytest.approx(freed, rel=1e-4)
    with pytest.raises(BadInput, match="weight format"):
        GpuServer.of(L70, "b200", "trtllm", "nvfp4", "nvfp4", 1)


def test_a_blackwell_gemm_reaches_its_measured_fraction_and_hopper_its_stated_one():
    for engine in ENGINES.values():
        hopper = dict(engine.efficiencies)["gemm"]
        assert engine.profile(get_hardware("h100"), "bfloat16").gemm_efficiency == hopper
        # Microsoft's GB200 GEMM benchmark: 2,744 of 5,000 dense FP8 TFLOP/s
        assert (
            engine.profile(B200, "nvfp4").gemm_efficiency == min(hopper, 0.55) == pytest.approx(2744 / 5000, abs=0.01)
        )


@pytest.mark.parametrize(
    "name, bf16_tflops, fp8_tflops, bandwidth_gb_s, memory_gb, link_gb_s, units",
    [
        ("b200", 2250, 4500, 8000, 180, 900, 148),  # HGX B200: 36 PFLOPS BF16 sparse over 8 GPUs, 1.4 TB
        ("gb200", 2500, 5000, 8000, 186, 900, 148),  # GB200 NVL72: 360 PFLOPS BF16 sparse over 72, 13.4 TB
        ("h20", 148, 296, 4000, 96, 450, 78),
        ("mi325x", 1307.4, 2614.9, 6000, 256, 448, 304),
    ],
)
def test_new_catalog_entries_carry_their_datasheet_figures(
    name, bf16_tflops, fp8_tflops, bandwidth_gb_s, memory_gb, link_gb_s, units
):
    hw = get_hardware(name)
    assert hw.peak("bf16") == pytest.approx(bf16_tflops * 1e12) and hw.peak("fp8") == pytest.approx(fp8_tflops * 1e12)
    assert hw.bandwidth_bytes_per_s == pytest.approx(bandwidth_gb_s * 1e9)
    assert hw.memory_bytes == pytest.approx(memory_gb * 1e9)
    assert hw.link_bytes_per_s == pytest.approx(link_gb_s * 1e9)  # a direction: NVLink 5 is 1.8 TB/s both ways
    assert hw.compute_units == units and "datasheet" in hw.source


def test_aliases_and_name_matching_find_the_right_blackwell_and_h20():
    assert get_hardware("GB200-NVL72") is HARDWARE["gb200"] and get_hardware("mi325") is HARDWARE["mi325x"]
    # prefill.bench.gpu takes the first catalog key whose stem is in the device's name
    first = {
        dev: next(k for k in HARDWARE if k.split("-")[0] in dev)
        for dev in ("nvidia gb200", "nvidia b200", "nvidia h20", "nvidia h200")
    }
    assert first == {"nvidia gb200": "gb200", "nvidia b200": "b200", "nvidia h20": "h20", "nvidia h200": "h200"}


def test_the_planner_deploys_fp4_on_blackwell_and_says_why_not_on_hopper():
    work = Workload(60, PromptLengths(200, 400), PromptLengths(50, 100))
    prices = {"h100": 2.99, "b200": 5.5}
    options = plan_deployments(
        PRESETS["llama-3.1-8b"], work, Load(rate=4.0), Slo(2.0, 0.1), prices, ("trtllm",), ("nvfp4",), "fp8", (1,)
    )
    (b200,) = [o for o in options if o.gpu == "b200"]
    (h100,) = [o for o in options if o.gpu == "h100"]
    assert b200.replicas == 1 and b200.weights == "nvfp4" and options[0] is b200
    assert h100.replicas is None and "FP4 tensor cores" in h100.note
