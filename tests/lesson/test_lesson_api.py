"""The lesson page's JSON API on the real server: every /api route, its numbers checked against prefill.costmodel.costs,
and bad input answered 400 with one clear message (the server keeps serving). No browser here."""

from __future__ import annotations

import threading

import httpx
import pytest

from prefill.costmodel import costs, roofline
from prefill.costmodel.causal import causal_blocks, causal_pairs
from prefill.costmodel.specs import PRESETS
from prefill.lesson import probe
from prefill.lesson.api import roof_points
from prefill.lesson.words import human, seed_lines, short_sci
from prefill.server.app import ServeConfig, model_id_of

pytestmark = pytest.mark.slow


def get(url: str, path: str, **params) -> httpx.Response:
    return httpx.get(f"{url}{path}", params=params, timeout=120)


def ok(url: str, path: str, **params) -> dict:
    r = get(url, path, **params)
    assert r.status_code == 200, r.text
    return r.json()


def refused(r: httpx.Response, *words: str) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert all(w in err["message"] for w in words), err["message"]


def test_display_helpers_write_the_seed_lines():
    assert short_sci(7e9) == "7e9" and short_sci(1.35e8) == "1.35e8" and short_sci(500) == "500"
    assert human(1.4e13, "FLOP") == "14 TFLOP" and human(0.09333, "s") == "93.3 ms" and human(2.5, "s") == "2.5 s"
    assert seed_lines(7e9, 1000, 1.4e13, 5e13, 0.28) == {
        "flops": "FLOPs ≈ 2 · N · P = 2 · 7e9 · 1,000 = 1.40e+13",
        "time": "time ≈ 1.40e+13 / 5.0e+13 = 0.28 s",
    }


def test_page_static_files_and_openapi_are_served(url):
    page = httpx.get(f"{url}/")
    assert page.status_code == 200 and "<title>Prefill" in page.text
    for path in ("/static/js/main.js", "/static/lesson.css", "/static/vendor/uplot/uPlot.esm.js"):
        r = httpx.get(f"{url}{path}")
        assert r.status_code == 200 and len(r.content) > 100, path
    assert "javascript" in httpx.get(f"{url}/static/js/main.js").headers["content-type"]
    assert "http" not in page.text.replace("http-equiv", "")  # nothing fetched from the network
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    for route in (
        "/api/estimate",
        "/api/mask",
        "/api/kv",
        "/api/request",
        "/api/answer",
        "/api/catalog",
        "/api/exercise",
        "/api/tokens",
        "/api/attention",
        "/api/predict",
        "/api/sweep/curve",
        "/api/sweep/measure",
        "/api/load",
    ):
        assert route in paths, route


def test_estimate_gives_the_seed_numbers(url):
    r = ok(url, "/api/estimate", N=7e9, P=1000, peak=1e14, mfu=0.5)
    assert r["lines"]["flops"] == "FLOPs ≈ 2 · N · P = 2 · 7e9 · 1,000 = 1.40e+13"
    assert r["lines"]["time"] == "time ≈ 1.40e+13 / 5.0e+13 = 0.28 s"
    assert r["flops"] == costs.prefill_flops(7e9, 1000) and r["seconds"] == pytest.approx(0.28)
    assert r["exact"] is None and r["kv"] is None
    fast = ok(url, "/api/estimate", N=7e9, P=1000, peak=3e14, mfu=0.5)
    assert fast["human"] == {"flops": "14 TFLOP", "seconds": "93.3 ms", "effective": "150 TFLOP/s"}


def test_estimate_with_a_preset_has_exact_flops_kv_and_the_roofline(url):
    spec = PRESETS["llama-3-8b"]
    r = ok(url, "/api/estimate", N=spec.N, P=4096, peak=989.4e12, mfu=0.5, bandwidth=3.35e12, model="llama-3-8b")
    count = costs.prefill_flops_exact(spec, 4096)
    assert r["exact"]["total"] == count.total and r["exact"]["attention"] == count.attention
    assert r["kv"]["bytes"] == costs.kv_cache_bytes_for(spec, 4096, 2) == 536_870_912
    assert r["kv"]["text"] == "536,870,912 B = 512.0 MiB = 536.9 MB" and r["kv"]["shape"] == [1, 8, 4096, 128]
    rf = r["roofline"]
    assert rf["ridge"] == pytest.approx(989.4e12 / 3.35e12)
    assert rf["prefill_bound"] == "compute-bound" and rf["decode_bound"] == "memory-bound"
    assert rf["decode_intensity"] == roofline.decode_intensity(2) == 1.0
    assert rf["compute_bound_from_P"] == roofline.compute_bound_prompt_length(spec, 2, rf["ridge"])
    roof = rf["roof"]
    assert max(roof["flops_per_s"]) == 989.4e12 and roof["flops_per_s"][0] == pytest.approx(0.1 * 3.35e12)


def test_the_roof_bends_exactly_at_the_ridge_point():
    peak, bandwidth = 989.4e12, 3.35e12  # ridge 295.3 FLOP/B, between two of the grid's samples (237 and 316)
    roof = roof_points(peak, bandwidth)
    xs, ys = roof["intensity"], roof["flops_per_s"]
    k = xs.index(roofline.ridge_point(peak, bandwidth))  # a vertex of the line drawn, not cut off by it
    assert xs == sorted(xs) and ys[k] == peak == ys[k + 1]
    assert ys[k - 1] == pytest.approx(xs[k - 1] * bandwidth) and ys[k - 1] < 0.81 * peak
    assert len(roof_points(peak, bandwidth, 3, 5)["intensity"]) == 17  # a ridge outside the range adds no sample


@pytest.mark.parametrize(
    "params,words",
    [
        ({"N": 0}, ("parameters must be at least 0.001 billion and at most 100,000 billion; you typed 0 billion",)),
        ({"N": -3e9}, ("parameters must be", "you typed -3 billion")),
        ({"N": 1e20}, ("parameters must be",)),
        ({"P": -1}, ("prompt tokens must be at least 0 and at most 10,000,000; you typed -1",)),
        ({"P": 10**9}, ("prompt tokens must be",)),
        ({"mfu": 0}, ("GPU utilisation must be at least 0.001 and at most 1; you typed 0",)),
        ({"mfu": 1.5}, ("GPU utilisation",)),
        ({"peak": 0}, ("the peak must be at least 0.001 TFLOP/s",)),
        ({"n": 0}, ("output tokens n must be at least 1",)),
        ({"N": "abc"}, ("N", "valid number")),
        ({"model": "gpt-9"}, ("unknown model", "llama-3-8b")),
        ({"dtype": "int3"}, ("unknown dtype",)),
        ({"N": "nan"}, ("parameters must be",)),
        ({"bandwidth": -1}, ("memory bandwidth must be at least 0.001 TB/s",)),
        ({"peak": 5e-324}, ("the peak must be at least 0.001 TFLOP/s",)),  # was: "overflows float64"
        ({"mfu": 1e-320}, ("GPU utilisation must be at least 0.001",)),
        ({"bandwidth": 5e-324}, ("memory bandwidth must be at least 0.001 TB/s",)),  # was: a ridge of inf
    ],
)
def test_estimate_refuses_bad_input_with_a_clear_message(url, params, words):
    refused(get(url, "/api/estimate", **params), *words)


def test_mask_rows_and_counts(url):
    r = ok(url, "/api/mask", P=5)
    assert r["rows"] == ["10000", "11000", "11100", "11110", "11111"]
    assert (r["allowed"], r["masked"], r["caption"]) == (15, 10, "15 pairs for 5 tokens")
    assert ok(url, "/api/mask", P=0)["rows"] == []
    big = ok(url, "/api/mask", P=256)
    assert big["allowed"] == causal_pairs(256) and sum(row.count("1") for row in big["rows"]) == causal_pairs(256)
    assert big["scale"] == 1 and len(big["rows"]) == 256
    long = ok(url, "/api/mask", P=1000)  # a long prompt's mask in cells of 4 x 4 tokens, 250 a side
    assert long["scale"] == 4 and long["rows"] == causal_blocks(1000, 4) and long["allowed"] == causal_pairs(1000)
    assert long["caption"] == "500,500 pairs for 1,000 tokens, each cell 4 x 4 tokens"
    refused(get(url, "/api/mask", P=-1), "P must be in [0, 1e+06]")
    refused(get(url, "/api/mask", P=1_000_001), "P must be in [0, 1e+06]")


def test_kv_of_the_loaded_model_and_of_a_preset(url, smollm):
    s = smollm.spec
    r = ok(url, "/api/kv", P=3)
    assert r["bytes"] == costs.kv_cache_bytes(s.L, s.H_kv, s.d_head, 3, 4) == 138_240  # float32 engine
    assert r["formula"] == "2 · L · B · H_kv · P · d_head · b = 2 · 30 · 1 · 3 · 3 · 64 · 4 = 138,240 B"
    assert r["shape"] == [1, 3, 3, 64]
    assert ok(url, "/api/kv", P=1000, model="llama-2-7b", dtype="fp16")["bytes"] == 524_288_000
    refused(get(url, "/api/kv", P=-5), "P must be")
    refused(get(url, "/api/kv", P=5, B=0), "B must be")
    refused(get(url, "/api/kv", P=5, model="nope"), "unknown model")


def test_request_is_the_worked_example(url):
    r = ok(url, "/api/request", ttft=0.2, itl=0.05, n=5)
    assert r["lines"] == {
        "request": "0.20 + 4 × 0.05 = 0.40 s",
        "decode": "1 / 0.05 = 20 tokens/s",
        "output": "5 / 0.40 = 12.5 tokens/s",
    }
    assert r["request_s"] == pytest.approx(0.4) and r["output_rate"] == pytest.approx(12.5)
    refused(get(url, "/api/request", ttft=0.2, itl=0, n=5), "ITL must be at least 1e-06 s")
    refused(get(url, "/api/request", ttft=-1, itl=0.05, n=5), "TTFT must be at least 1e-06 s")
    refused(get(url, "/api/request", ttft=0.2, itl=0.05, n=0), "output tokens n must be at least 1")
    refused(get(url, "/api/request", ttft=0.2, itl=5e-324, n=5), "ITL must be at least 1e-06 s")  # was: float64
    refused(get(url, "/api/request", ttft=0, itl=0.05, n=1), "TTFT must be at least 1e-06 s")  # was: 0 s in all


def test_answer_checks_hints_and_reveals(url):
    post = lambda body: httpx.post(f"{url}/api/answer", json=body)  # noqa: E731
    assert post({"question": "flops", "answer": "1.4 × 10^13"}).json()["correct"] is True
    wrong = post({"question": "flops", "answer": "7e12"}).json()
    assert wrong["correct"] is False and wrong["answer"] is None and "1.4e+13" not in wrong["message"]
    assert post({"question": "pairs", "reveal": True}).json()["answer"] == 10
    assert "write it like" in post({"question": "seconds", "answer": "fast"}).json()["message"]
    refused(post({"question": "nope", "answer": "1"}), "question", "'flops', 'seconds' or 'pairs'")
    refused(post({"question": "flops", "answer": 14}), "answer")
    refused(post({"question": "flops", "code": "import os"}), "code")  # extra fields refused: nothing is run


def test_exercise_skeleton_is_the_one_the_cli_writes(url):
    from prefill.lesson.exercise import skeleton

    r = ok(url, "/api/exercise")
    assert r["skeleton"] == skeleton() and len(r["functions"]) == 5


def test_catalog_lists_hardware_presets_and_the_loaded_model(url, smollm):
    r = ok(url, "/api/catalog")
    assert {h["key"] for h in r["hardware"]} >= {"h100-sxm", "a100-80gb", "l4"}
    assert {m["key"] for m in r["models"]} == set(PRESETS)
    names = [m["name"] for m in r["models"]]
    assert len(names) == len(set(names)), names  # one entry per model: no alias listed beside its model
    assert r["loaded"]["name"] == "SmolLM2-135M-Instruct"  # the file's name, not the GGUF's general.name
    assert (
        r["loaded"]["model_id"] == model_id_of(smollm) and r["loaded"]["L"] == 30 and r["loaded"]["dtype"] == "float32"
    )


def test_tokens_label_each_id(url):
    r = ok(url, "/api/tokens", text="AI is fast", chat=0)
    assert r["labels"] == ["AI", " is", " fast"] and r["P"] == 3 and r["kv"]["shape"] == [1, 3, 3, 64]
    chat = ok(url, "/api/tokens", text="AI is fast", chat=1)
    assert chat["labels"][0] == "<|im_start|>" and chat["P"] > 3
    refused(get(url, "/api/tokens", text="   "), "empty")
    refused(get(url, "/api/tokens", text="x", chat=2), "chat must be in [0, 1]")
    refused(get(url, "/api/tokens", text="x" * 20_001), "at most 20000 characters")


def test_attention_is_a_causal_softmax(url):
    r = httpx.post(f"{url}/api/attention", json={"text": "AI is fast", "layer": 3, "head": 5}, timeout=60)
    assert r.status_code == 200, r.text
    a = r.json()
    A = a["weights"]
    assert a["P"] == 3 and a["labels"] == ["AI", " is", " fast"] and a["kv_head"] == 5 // 3
    assert all(A[i][j] == 0 for i in range(3) for j in range(i + 1, 3)) and a["upper_max"] == 0
    assert all(abs(sum(row) - 1) < 1e-5 for row in A)
    bad = lambda body: httpx.post(f"{url}/api/attention", json=body)  # noqa: E731
    refused(bad({"text": "AI", "layer": 30, "head": 0}), "layer must be in [0, 29]")
    refused(bad({"text": "AI", "layer": 0, "head": 9}), "head must be in [0, 8]")
    refused(bad({"text": "", "layer": 0, "head": 0}), "text")
    refused(bad({"text": "AI", "layer": "0", "head": 0}), "layer")


def test_attention_bounds_are_the_models_and_in_the_document(url, smollm):
    """layer and head up to the model's last (written into the document when the lesson mounts); a prompt longer
    than the probe's 64 tokens is shown over its first 64, as the document says, not refused."""
    spec = smollm.spec
    fields = httpx.get(f"{url}/openapi.json").json()["components"]["schemas"]["AttentionBody"]["properties"]
    assert (fields["layer"]["minimum"], fields["layer"]["maximum"]) == (0, spec.L - 1) == (0, 29)
    assert (fields["head"]["minimum"], fields["head"]["maximum"]) == (0, spec.H_q - 1) == (0, 8)
    last = httpx.post(f"{url}/api/attention", json={"text": "AI", "layer": 29, "head": 8}, timeout=60)
    assert last.status_code == 200 and last.json()["kv_head"] == 8 // 3
    refused(httpx.post(f"{url}/api/attention", json={"text": "AI", "head": -1}), "head")
    whole = httpx.post(f"{url}/api/attention", json={"text": "AI", "layer": 3.0, "head": 5.0}, timeout=60)
    assert whole.status_code == 200 and whole.json()["layer"] == 3  # an integer-valued number is an integer
    text = "word " * 80
    long = httpx.post(f"{url}/api/attention", json={"text": text}, timeout=60).json()
    P = len(smollm.encode_prompt(text, chat=False))
    assert P > probe.MAX_P and (long["P"], long["prompt_P"]) == (probe.MAX_P, P)
    assert len(long["weights"]) == len(long["labels"]) == probe.MAX_P and long["upper_max"] == 0


def test_attention_is_computed_on_the_worker_thread(url, monkeypatch):
    """The probe's forwards and its checks run on the server's worker thread (between two steps), never on a
    thread of Starlette's pool beside it (tests/lesson/test_one_compute_thread.py: nor on the event loop)."""
    from prefill.lesson import live

    probe, threads = live.attention_map, []

    def recorded(*args):
        threads.append(threading.current_thread().name)
        return probe(*args)

    monkeypatch.setattr(live, "attention_map", recorded)
    assert httpx.post(f"{url}/api/attention", json={"text": "AI is fast"}, timeout=60).status_code == 200
    assert threads == ["prefill-worker"]


def test_predict_beside_a_measurement_gives_its_error_and_what_set_its_time(url, smollm):
    p = ok(url, "/api/predict", P=3, prefill_s=0.05, n=12, itl=[0.04, 0.05, 0.03], ttft_s=0.06)
    assert p["error"] == pytest.approx(p["predicted_prefill_s"] / 0.05 - 1) and p["human"]["error"].endswith("%")
    assert p["dominant"] in ("compute", "memory", "overhead") and p["method"].endswith(f"{p['dominant']}-bound")
    assert p["note"].startswith(f"3 tokens, one pass: {p['dominant']}-bound") and "weights" in p["note"]
    assert p["predicted_itl_s"] == pytest.approx(smollm.predict_itl_seconds(3, 12))  # the server's own rule
    assert (p["itl_p50_s"], p["itl_mean_s"]) == (0.04, pytest.approx(0.04))  # median and mean, computed here
    assert p["itl_error"] == pytest.approx(p["predicted_itl_s"] / 0.04 - 1)
    assert p["request_model_s"] == pytest.approx(0.06 + 11 * 0.04)  # TTFT + (n - 1) · mean ITL
    hit = ok(url, "/api/predict", P=40, cached=32, prefill_s=0.05)
    assert (hit["computed"], hit["cached"]) == (8, 32)
    assert hit["note"].startswith("8 tokens computed; 32 came from the prefix cache, one pass: ")
    assert hit["predicted_prefill_s"] == pytest.approx(smollm.predict_prefill(8, 32).seconds)
    chunk = ServeConfig(model_id_of(smollm)).chunk_size  # the server's: a longer prompt is prefilled in chunks
    long = ok(url, "/api/predict", P=chunk + 44, prefill_s=0.2)
    assert long["forwards"] == 2 and long["prefill"] == f"{chunk + 44} tokens, in 2 chunks of at most {chunk}"
    assert long["predicted_prefill_s"] == pytest.approx(smollm.predict_prefill(chunk + 44, 0, chunk).seconds)
    cold = ok(url, "/api/predict", P=3, prefill_s=0.05, cold=1)
    assert cold["cold"] and cold["note"].endswith("which is cold again).") and cold["human"]["error"].endswith(", cold")
    alone = ok(url, "/api/predict", P=3)  # nothing measured: nothing to compare, and one token has no ITL
    assert "error" not in alone and "note" not in alone and alone["predicted_itl_s"] is None
    refused(get(url, "/api/predict", P=3, n=0), "n must be in [1")
    refused(get(url, "/api/predict", P=3, n=4, itl=-1), "itl must be in [0")


def test_predict_uses_the_measured_rates_and_gives_one_verdict(url, smollm):
    p = ok(url, "/api/predict", P=3, prefill_s=0.01, tokenize_s=0.001)
    count = costs.prefill_flops_exact(smollm.spec, 3)
    assert p["flops"] == count.total and p["gemm_rate"] > 1e8
    assert p["mfu"] == pytest.approx(costs.mfu(count.total, 0.01, p["gemm_rate"]))
    assert p["predicted_ttft_s"] == pytest.approx(p["predicted_prefill_s"] + 0.001)
    v, profile = p["verdict"], smollm.profile()
    pred = smollm.predict_prefill(3, 0, ServeConfig(model_id_of(smollm)).chunk_size, profile=profile)
    # one verdict: the time model's dominant part, its FLOP/B against the profile's ridge, as the sweep's
    assert v["bound"] == f"{pred.dominant}-bound" == f"{p['dominant']}-bound" and v["words"].startswith(v["bound"])
    assert v["intensity"] == pytest.approx(pred.flops / pred.bytes)
    assert v["ridge"] == pytest.approx(profile.peak_flops_per_s / profile.bandwidth_bytes_per_s)
    assert v["measured_flops_per_s"] == pytest.approx(pred.flops / 0.01)
    assert v["weights"] == f"{human(pred.weights_per_forward, 'B')} of float32 weights, {smollm.precision}"
    assert smollm.precision == "float32 activations, float32 K/V"
    assert p["decode"]["bound"] == f"{smollm.predict_decode([3], profile=profile).dominant}-bound"
    cached = ok(url, "/api/predict", P=40, cached=32, prefill_s=0.01)
    assert cached["flops"] == costs.prefill_flops_exact(smollm.spec, 8, 32).total  # only the 8 new tokens run
    whole = ok(url, "/api/predict", P=40, cached=40)  # the last prompt token is always computed: read as 39
    assert (whole["cached"], whole["computed"]) == (39, 1)
    assert whole["flops"] == costs.prefill_flops_exact(smollm.spec, 1, 39).total
    refused(get(url, "/api/predict", P=0), "P must be in [1")
    refused(get(url, "/api/predict", P=3, prefill_s=0), "prefill_s must be in [1e-06, 3600]")
    refused(get(url, "/api/predict", P=3, prefill_s=5e-324), "prefill_s must be in [1e-06")  # was: float64


def test_guesses_sit_beside_what_was_measured(url, smollm):
    p = ok(url, "/api/predict", P=3, prefill_s=0.01, ttft_s=0.02, guess_ttft_s=0.01, guess_kv=150_000)
    kv = costs.kv_cache_bytes_for(smollm.spec, 3, 4)
    assert kv == 138_240  # the lesson's "AI is fast": 3 tokens of 30 layers, 3 KV heads, d_head 64, float32
    ttft, kv_guess = p["guesses"]
    assert (ttft["what"], ttft["error"]) == ("TTFT", pytest.approx(0.01 / 0.02 - 1))
    assert (kv_guess["actual"], kv_guess["error"]) == (kv, pytest.approx(150_000 / kv - 1))
    assert kv_guess["words"] == "your guess 150 kB beside 138 kB: +9%"
    assert ok(url, "/api/predict", P=3)["guesses"] == []  # nothing guessed, nothing shown


def test_the_server_keeps_serving_after_bad_input(url):
    for _ in range(3):
        get(url, "/api/estimate", N=-1)
    assert ok(url, "/api/mask", P=2)["rows"] == ["10", "11"]
    assert httpx.get(f"{url}/health").json()["status"] == "ok"
