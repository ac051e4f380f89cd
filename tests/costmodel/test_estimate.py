"""The one estimate builder: the lessons' worked numbers, the parts that apply to each setting, and its JSON."""

import json
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from prefill.costmodel import costs
from prefill.costmodel.estimate import Setting, build_estimate, request_time
from prefill.costmodel.hardware import HARDWARE
from prefill.costmodel.specs import PRESETS
from prefill.errors import BadInput

LLAMA3_8B = PRESETS["llama-3-8b"]
H100 = HARDWARE["h100-sxm"]


def on_h100(**kw) -> Setting:
    kw.setdefault("peak_flops_per_s", H100.peak("bf16"))
    return Setting(bandwidth_bytes_per_s=H100.bandwidth_bytes_per_s, link_bytes_per_s=H100.link_bytes_per_s, **kw)


def test_the_seeds_7b_1000_tokens_at_300_tflops_half_mfu():
    est = build_estimate(Setting(P=1000, N=7e9, peak_flops_per_s=3e14, mfu=0.5, bandwidth_bytes_per_s=2e12))
    assert est.flops_2NP == 1.4e13
    assert est.prefill_s_2NP == pytest.approx(0.0933333, rel=1e-6)
    assert est.achieved_flops_per_s == 1.5e14
    assert est.ttft.prefill_s == est.prefill_s_2NP == est.ttft.ttft_s  # no shapes: TTFT's prefill is 2*N*P
    assert est.exact is est.kv is est.tensor_parallel is est.request is None
    assert est.roofline.prefill_intensity == 1000.0  # weight bytes only: 2 * P / b with b = 2
    assert est.roofline.ridge_point == 150.0 and est.roofline.prefill_bound == "compute-bound"


def test_llama3_8b_on_h100_exact_kv_and_roofline():
    est = build_estimate(on_h100(P=1000, spec=LLAMA3_8B, network_s=0.02, tokenize_s=0.001))
    count = costs.prefill_flops_exact(LLAMA3_8B, 1000)
    assert est.N == LLAMA3_8B.N and est.flops_2NP == 2 * LLAMA3_8B.N * 1000
    assert est.exact == count and est.flops_exact_minus_2NP == count.total - est.flops_2NP
    assert est.prefill_s_exact == pytest.approx(count.total / (989.4e12 * 0.5))
    assert est.ttft.prefill_s == est.prefill_s_exact  # the exact count, not the rule, goes into TTFT
    assert est.ttft.ttft_s == pytest.approx(est.prefill_s_exact + 0.021)
    # the lesson's KV cache: 2 * L * H_kv * P * d_head * b = 2 * 32 * 8 * 1000 * 128 * 2
    assert (est.kv.bytes, est.kv.bytes_per_token, est.kv.bytes_per_gpu) == (131_072_000, 131_072, 131_072_000)
    rf = est.roofline
    assert rf.ridge_point == pytest.approx(989.4e12 / 3350e9)
    assert (rf.prefill_bound, rf.decode_bound, rf.decode_intensity) == ("compute-bound", "memory-bound", 1.0)
    assert rf.decode_attainable_flops_per_s == pytest.approx(3350e9)  # 1 FLOP/B x the bandwidth, under the roof
    assert rf.prefill_attainable_flops_per_s == 989.4e12
    assert 250 < rf.compute_bound_from_P < 400


def test_tensor_parallel_llama3_70b_on_4_h100():
    spec = PRESETS["llama-3-70b"]
    est = build_estimate(on_h100(P=4096, spec=spec, T=4))
    tp = est.tensor_parallel
    payload = 2 * 80 * 4096 * 8192 * 2  # 2 all-reduces per layer of [B, P, d_model] in bf16
    assert tp.T == 4 and tp.flops_per_gpu == pytest.approx(est.exact.total / 4)
    assert tp.allreduce_bytes_per_gpu == pytest.approx(1.5 * payload)  # 2 * (T - 1) / T
    assert tp.allreduce_s == pytest.approx(1.5 * payload / 450e9)
    assert tp.prefill_s == pytest.approx(est.prefill_s_exact / 4 + tp.allreduce_s)
    assert est.ttft.prefill_s == tp.prefill_s
    assert tp.kv_heads_per_gpu == 2 and est.kv.bytes_per_gpu == est.kv.bytes // 4


def test_tensor_parallel_without_a_known_link_counts_no_allreduce():
    spec = PRESETS["llama-3-70b"]
    est = build_estimate(Setting(P=512, spec=spec, T=2, peak_flops_per_s=1e15, bandwidth_bytes_per_s=3e12))
    assert est.tensor_parallel.allreduce_s is None
    assert est.tensor_parallel.prefill_s == pytest.approx(est.prefill_s_exact / 2)


def test_the_page_may_set_N_apart_from_the_models_shapes():
    est = build_estimate(on_h100(P=1000, spec=LLAMA3_8B, N=7e9))
    assert est.N == 7e9 and est.flops_2NP == 1.4e13  # the slider's N in the seed's rule
    assert est.exact.total == costs.prefill_flops_exact(LLAMA3_8B, 1000).total  # the model's shapes in the count


def test_batch_multiplies_tokens_flops_and_kv():
    one = build_estimate(on_h100(P=512, spec=PRESETS["mistral-7b-v0.1"], dtype="fp8"))
    four = build_estimate(on_h100(P=512, spec=PRESETS["mistral-7b-v0.1"], dtype="fp8", B=4))
    assert four.flops_2NP == 4 * one.flops_2NP and four.exact.total == 4 * one.exact.total
    assert four.kv.bytes == 4 * one.kv.bytes == 2 * 32 * 4 * 8 * 512 * 128 * 1
    assert (four.dtype, four.bytes_per_element) == ("fp8", 1)


def test_calibrated_prediction_needs_a_calibration_and_shapes():
    cal = costs.Calibration(0.003, 9e10, 3e10, "float32", 2, "test")
    spec = PRESETS["smollm2-135m"]
    est = build_estimate(
        Setting(
            P=256,
            spec=spec,
            peak_flops_per_s=1e11,
            mfu=1.0,
            bandwidth_bytes_per_s=2e10,
            calibration=cal,
            dtype="float32",
        )
    )
    assert est.calibrated_prefill_s == costs.calibrated_prefill_seconds(costs.prefill_flops_exact(spec, 256), cal)
    no_shapes = Setting(P=256, N=1.35e8, peak_flops_per_s=1e11, bandwidth_bytes_per_s=2e10, calibration=cal)
    assert build_estimate(no_shapes).calibrated_prefill_s is None


def test_request_time_the_chapters_worked_example():
    r = request_time(0.2, 5, 0.05)
    assert r.request_s == pytest.approx(0.4)  # 0.2 + 4 x 0.05
    assert r.decode_rate == pytest.approx(20.0) and r.output_rate == pytest.approx(12.5)
    est = build_estimate(on_h100(P=1000, spec=LLAMA3_8B, output_tokens=5, itl_s=0.05))
    assert est.request.request_s == pytest.approx(est.ttft.ttft_s + 4 * 0.05)


def test_an_empty_prompt_costs_nothing():
    est = build_estimate(on_h100(P=0, spec=LLAMA3_8B))
    assert est.flops_2NP == est.exact.total == est.kv.bytes == est.ttft.ttft_s == 0
    assert est.roofline.prefill_intensity == 0.0 and est.roofline.prefill_bound == "memory-bound"


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"N": None}, "shapes or a parameter count"),
        ({"B": 0}, "B >= 1"),
        ({"P": -1}, "P >= 0"),
        ({"T": 2}, "needs the model's shapes"),
    ],
)
def test_settings_no_estimate_can_have(kw, match):
    with pytest.raises(BadInput, match=match):
        Setting(**{"P": 10, "N": 7e9, "peak_flops_per_s": 1e14, "bandwidth_bytes_per_s": 2e12, **kw})


@pytest.mark.parametrize("kw", [{"mfu": 1.5}, {"mfu": 0.0}, {"N": -5.0}, {"peak_flops_per_s": 0.0}, {"dtype": "fp7"}])
def test_values_the_formulas_refuse(kw):
    with pytest.raises(ValueError):
        build_estimate(Setting(**{"P": 10, "N": 7e9, "peak_flops_per_s": 1e14, "bandwidth_bytes_per_s": 2e12, **kw}))


def test_json_leaves_out_the_parts_that_do_not_apply():
    only_n = build_estimate(Setting(P=1000, N=7e9, peak_flops_per_s=1e14, bandwidth_bytes_per_s=2e12)).to_dict()
    assert only_n["model"] is None and only_n["prefill_s_2NP"] == pytest.approx(0.28)
    assert not {"flops_exact", "kv_cache_bytes", "tp_prefill_s", "request"} & only_n.keys()
    full = build_estimate(on_h100(P=4096, spec=PRESETS["llama-3-70b"], T=4, output_tokens=8, itl_s=0.01))
    r = json.loads(json.dumps(full.to_dict()))
    assert r["flops_exact"] == full.exact.to_dict() and r["tp"] == 4 and r["tp_kv_heads_per_gpu"] == 2
    assert r["kv_cache_bytes_per_gpu"] == full.kv.bytes_per_gpu and r["ttft_s"] == full.ttft.ttft_s
    assert r["request"]["request_s"] == pytest.approx(full.ttft.ttft_s + 7 * 0.01)
    assert r["prefill_bound"] == full.roofline.prefill_bound and r["hardware"] == "custom"


@given(
    P=st.integers(1, 100_000),
    B=st.integers(1, 64),
    mfu=st.floats(0.01, 1.0),
    net=st.floats(0, 1),
    tok=st.floats(0, 1),
)
def test_seconds_are_the_counts_over_the_achieved_rate(P, B, mfu, net, tok):
    est = build_estimate(on_h100(P=P, B=B, spec=LLAMA3_8B, mfu=mfu, network_s=net, tokenize_s=tok))
    assert est.prefill_s_exact * est.achieved_flops_per_s == pytest.approx(est.exact.total, rel=1e-12)
    assert est.prefill_s_2NP * est.achieved_flops_per_s == pytest.approx(est.flops_2NP, rel=1e-12)
    assert est.ttft.ttft_s == pytest.approx(net + tok + est.prefill_s_exact, rel=1e-12)


def test_the_builder_imports_no_torch():
    code = "import sys, prefill.costmodel.estimate; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
