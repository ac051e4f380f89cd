"""The GPU step model as engines run it: one batched attention kernel a layer whose time is the K/V bytes read,
CUDA-graph launches per step, GEMM efficiency by M, FP8 weights and KV, all-reduce latency; the same
timemodel.predict_step as the CPU's, on an engine's profile and layout. Worked numbers, no timing."""

import subprocess
import sys

import pytest

from prefill.costmodel import storage
from prefill.costmodel.engines import ENGINES, get_engine
from prefill.costmodel.hardware import get_hardware
from prefill.costmodel.ops import LAUNCHES, Row, forward_ops
from prefill.costmodel.specs import PRESETS
from prefill.costmodel.timemodel import predict_decode, predict_step
from prefill.errors import BadInput

LLAMA = PRESETS["llama-3.1-8b"]
H100 = get_hardware("h100")
VLLM = get_engine("vllm")


def kv_bytes_read(rows: int, context: int, kv_bytes: int) -> float:
    """K and V of every layer at `context` positions (and the new one) for `rows` rows."""
    return rows * 2 * LLAMA.L * LLAMA.H_kv * LLAMA.d_head * (context + 1) * kv_bytes


def test_a_decode_steps_attention_is_one_kernel_a_layer_timed_by_the_kv_bytes_it_reads():
    prof, lay = VLLM.profile(H100, "bfloat16"), VLLM.layout("bfloat16")
    short, long = (predict_decode(LLAMA, [c] * 500, prof, lay) for c in (200, 1000))
    a_short, a_long = short.by_op()["attention"], long.by_op()["attention"]
    assert len([o for o in forward_ops(LLAMA, [Row(1, 200)] * 500, lay) if o.kind == "attention"]) == 1
    assert a_short.bytes == pytest.approx(kv_bytes_read(500, 200, 2) + 500 * 2 * LLAMA.L * LLAMA.H_q * 128 * 2)
    extra = kv_bytes_read(500, 1000, 2) - kv_bytes_read(500, 200, 2)  # 800 more positions a row: 52 GB
    assert a_long.seconds - a_short.seconds == pytest.approx(extra / prof.bandwidth_bytes_per_s, rel=1e-6)
    assert long.seconds - short.seconds == pytest.approx(extra / prof.bandwidth_bytes_per_s, rel=1e-6)


def test_our_engine_on_a_gpu_batches_attention_and_launches_its_eager_kernels():
    lay = get_engine("prefill").layout("bfloat16")
    ops = forward_ops(LLAMA, [Row(1, 200)] * 5, lay)
    assert len([o for o in ops if o.kind == "attention"]) == 1  # one kernel a layer, as vLLM's
    assert {o.name: o.launches for o in ops}["rotary"] == LAUNCHES["rotary"]  # eager PyTorch: 5 kernels


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_a_decode_steps_time_grows_with_its_context_on_every_engine(engine):
    """256 decode rows of Llama 3 8B on an H100, BF16 and FP8: 800 more positions a row read 800 more positions
    of K/V a row, at the engine's bandwidth; the step grows by that read and by nothing less."""
    e = get_engine(engine)
    for weights, kv, kv_bytes in (("bfloat16", "bfloat16", 2), ("fp8", "fp8", 1)):
        prof, lay = e.profile(H100, weights), e.layout(weights, kv)
        short, long = (predict_decode(LLAMA, [c] * 256, prof, lay).seconds for c in (200, 1000))
        extra = kv_bytes_read(256, 1000, kv_bytes) - kv_bytes_read(256, 200, kv_bytes)
        assert long - short == pytest.approx(extra / prof.bandwidth_bytes_per_s, rel=1e-6), (engine, weights)


def test_a_graphed_decode_step_launches_once_and_an_eager_one_per_kernel():
    prof, lay = VLLM.profile(H100, "bfloat16"), VLLM.layout("bfloat16")
    graphed = predict_decode(LLAMA, [100] * 8, prof, lay)
    assert sum(o.overhead_s for o in graphed.ops) == 0.0 and graphed.launch_wait_s == prof.graph_launch_s
    eager_prof = prof.with_fit(graph_tokens=0, op_overhead_s=50e-6)  # slow launches: the GPU waits on them
    eager = predict_decode(LLAMA, [100] * 8, eager_prof, lay)
    launches = sum(o.count * o.launches for o in forward_ops(LLAMA, [Row(1, 100)] * 8, lay))
    assert sum(o.overhead_s for o in eager.ops) == pytest.approx(launches * 50e-6)
    assert eager.seconds > graphed.seconds
    # beyond the captured sizes the step runs eagerly; SGLang graphs decode steps only, vLLM mixed ones too
    assert not prof.graphed(513, True) and prof.graphed(300, False)
    assert not get_engine("sglang").profile(H100, "bfloat16").graphed(100, False)


def test_gemm_efficiency_follows_its_stated_curve_by_m():
    prof = VLLM.profile(H100, "bfloat16")
    peak = H100.peak("bfloat16") * prof.gemm_efficiency
    for M in (16, 128, 1024, 8192):
        assert prof.gemm_rate(M, 4096, 4096) == pytest.approx(peak * M / (M + 128))


def test_fp8_weights_halve_the_weights_read_and_run_at_the_fp8_peak():
    bf, f8 = VLLM.profile(H100, "bfloat16"), VLLM.profile(H100, "fp8")
    one_bf = predict_decode(LLAMA, [100], bf, VLLM.layout("bfloat16")).by_op()["gate_up"]
    one_f8 = predict_decode(LLAMA, [100], f8, VLLM.layout("fp8")).by_op()["gate_up"]
    assert one_f8.weight_bytes == pytest.approx(one_bf.weight_bytes / 2)
    # the datasheet's FP8 peak, 1,978.9 TFLOP/s, is twice its BF16 one to the table's rounding
    assert f8.gemm_rate(4096, 4096, 4096) == pytest.approx(2 * bf.gemm_rate(4096, 4096, 4096), rel=1e-4)
    assert f8.attention_peak() == pytest.approx(bf.attention_peak())  # attention stays BF16


def test_an_fp8_kv_cache_reads_half_the_bytes_and_holds_twice_the_positions():
    lay16, lay8 = VLLM.layout("fp8", kv="bfloat16"), VLLM.layout("fp8", kv="fp8")
    prof = VLLM.profile(H100, "fp8")
    a16 = predict_decode(LLAMA, [1000] * 100, prof, lay16).by_op()["attention"]
    a8 = predict_decode(LLAMA, [1000] * 100, prof, lay8).by_op()["attention"]
    qo = 100 * 2 * LLAMA.L * LLAMA.H_q * LLAMA.d_head * 2  # Q read and O written, BF16 either way
    assert a16.bytes - qo == pytest.approx(2 * (a8.bytes - qo)) == pytest.approx(kv_bytes_read(100, 1000, 2))
    t16, t8 = (VLLM.kv_tokens(LLAMA, H100, "fp8", kv, 1) for kv in ("bfloat16", "fp8"))
    assert t8 == pytest.approx(2 * t16, abs=2)


def test_each_all_reduce_costs_its_latency_plus_its_bytes_over_the_link():
    prof, lay = VLLM.profile(H100, "bfloat16"), VLLM.layout("bfloat16", tp=2)
    ar = predict_step(LLAMA, [Row(1, 10)] * 4, prof, lay).by_op()["allreduce"]
    ring = 2 * (2 - 1) / 2 * 4 * LLAMA.d_model * 2  # bytes of one all-reduce of [4, d_model] in BF16
    assert ar.seconds == pytest.approx(2 * LLAMA.L * (prof.link_latency_s + ring / H100.link_bytes_per_s))


def test_kv_capacity_is_the_memory_fraction_less_the_weights():
    tokens = VLLM.kv_tokens(LLAMA, H100, "bfloat16", None, 1)
    per_position = 2 * LLAMA.L * LLAMA.H_kv * LLAMA.d_head * 2
    weights = storage.weight_bytes(LLAMA, "bfloat16")  # 16.1 GB
    free = 0.9 * 80e9 - weights - VLLM.reserve_bytes
    assert free - per_position < tokens * per_position <= free


def test_every_engine_is_named_and_a_wrong_one_is_refused():
    assert set(ENGINES) == {"vllm", "sglang", "trtllm", "prefill"}
    with pytest.raises(BadInput, match="choose one of"):
        get_engine("tgi")


def test_the_cost_model_imports_no_torch():
    code = "import sys, prefill.costmodel.engines, prefill.costmodel.timemodel; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_gpu_kernel_takes_at_least_its_floor_and_an_engine_runs_one_kernel_an_operation():
    prof, lay = VLLM.profile(H100, "bfloat16"), VLLM.layout("bfloat16")
    ops = forward_ops(LLAMA, [Row(1, 10)], lay)
    assert all(o.launches == 1 for o in ops)  # fused RMSNorm, rotary, cache write, SiLU x up
    step = predict_decode(LLAMA, [10], prof, lay).by_op()
    assert step["residual"].seconds == pytest.approx(2 * LLAMA.L * prof.kernel_floor_s)  # 2 a layer, tiny work
    assert step["down"].seconds > LLAMA.L * prof.kernel_floor_s  # a real GEMM is its bytes, above the floor
    assert get_engine("prefill").profile(H100, "bfloat16").kernel_floor_s == prof.kernel_floor_s  # eager too


def test_sglangs_memory_fraction_falls_with_the_tp_width():
    sglang, llama70 = get_engine("sglang"), PRESETS["llama-3-70b"]
    assert [sglang.fraction(t) for t in (1, 2, 4, 8)] == [0.88, 0.87, 0.85, 0.81]
    per = 2 * llama70.L * (llama70.H_kv // 4) * llama70.d_head * 2  # one position's K/V on one of 4 GPUs
    free = 0.85 * 80e9 - storage.weight_bytes(llama70, "bfloat16") / 4 - sglang.reserve_bytes
    assert sglang.kv_tokens(llama70, H100, "bfloat16", None, 4) == int(free // per)


@pytest.mark.parametrize(("model", "tp"), [("llama-3-70b", 4), ("gemma-3-4b", 1)])  # gemma: two windows a step
def test_a_step_models_seconds_are_predict_steps_exactly_with_each_step_shape_timed_once(model, tp):
    """StepModel.seconds on a GPU engine remembers every operation but attention by the step's tokens,
    unembedded positions and decode-only flag, and gives predict_step's seconds to the last bit (the same sum
    in the same order) for decode steps, mixed steps, chunked prefills and a scoring row."""
    import random

    from prefill.costmodel.timemodel import StepModel

    spec = PRESETS[model]
    prof, lay = VLLM.profile(H100, "bfloat16"), VLLM.layout("bfloat16", None, tp)
    model_ = StepModel(spec, prof, lay)
    rng = random.Random(0)
    shapes = [[Row(1, c) for c in (10, 5000)], [Row(1, c) for c in (3000, 20)], [Row(512, 0)], [Row(512, 512)]]
    shapes += [[Row(1, rng.randint(1, 4000)) for _ in range(rng.randint(1, 80))] for _ in range(40)]
    shapes += [[Row(1, 900), Row(rng.randint(2, 900), rng.randint(0, 900))] for _ in range(20)]
    shapes += [[Row(64, 100, logits=64), Row(1, 50)]]
    for rows in shapes:
        assert model_.seconds(rows) == predict_step(spec, rows, prof, lay).seconds, rows
    keys = {(sum(r.new for r in rows), sum(r.logits for r in rows), all(r.new == 1 for r in rows)) for rows in shapes}
    assert set(model_._steps) == keys  # one entry a distinct (tokens, unembedded, decode only)
