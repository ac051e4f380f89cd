"""The lesson page's P sweep and simulated load on the real server (the embedded model): the predicted curve's
shape, one warm measurement beside its prediction, TTFT against the arrival rate, and bad input answered 400.

The time model reads a fixed profile here: a quick probe on a busy shared machine can be anything (one here
predicted P = 1 at 1.2 s and P = 269-1024 memory-bound), and these tests are about the routes and the time model,
not the probe's noise. The browser test runs the page on the probed profile."""

from __future__ import annotations

import threading

import httpx
import pytest
from test_lesson_api import get, ok, refused

from prefill.costmodel import costs
from prefill.costmodel.profile import MachineProfile
from prefill.lesson import load, sweep
from prefill.lesson.state import LessonState

pytestmark = pytest.mark.slow
FIXED = MachineProfile("a fixed CPU", "float32", 1e11, 1.6e10, 5e-6, "fixed in tests/lesson/test_sweep_and_load.py")


@pytest.fixture(scope="module", autouse=True)
def fixed_profile():
    async def profile(self) -> MachineProfile:
        return FIXED

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(LessonState, "profile", profile)
        yield


def post(url: str, body) -> httpx.Response:
    return httpx.post(f"{url}/api/sweep/measure", json=body, timeout=120)


@pytest.fixture(scope="module")
def curve(url):
    return ok(url, "/api/sweep/curve")


@pytest.fixture(scope="module")
def capacity(url):
    return ok(url, "/api/load")["capacity_req_per_s"]


def test_the_predicted_curve_turns_from_memory_to_compute_bound(curve, smollm):
    points = curve["points"]
    Ps = [p["P"] for p in points]
    assert Ps == sorted(set(Ps)) and Ps[0] == 1 and Ps[-1] == min(smollm.spec.context_length, 8192)
    assert 25 <= len(points) <= 40 and set(curve["measure_P"]) <= set(Ps)
    for key in ("predicted_s", "flops", "intensity"):
        values = [p[key] for p in points]
        assert all(a < b for a, b in zip(values, values[1:], strict=False)), key
    assert curve["profile"]["name"] == FIXED.name
    for p in points:  # the time model's own numbers, nothing re-derived on the way
        pred = smollm.predict_prefill(p["P"], profile=FIXED)
        assert (p["predicted_s"], p["flops"], p["bytes"], p["dominant"]) == (
            pred.seconds,
            pred.flops,
            pred.bytes,
            pred.dominant,
        )
    assert points[0]["dominant"] == "memory" and points[-1]["dominant"] == "compute"
    turn = curve["compute_bound_from_P"]
    assert all((p["dominant"] == "compute") == (p["P"] >= turn) for p in points)
    assert curve["ridge"] == pytest.approx(curve["peak_flops_per_s"] / curve["bandwidth_bytes_per_s"])
    assert max(curve["roof"]["flops_per_s"]) == curve["peak_flops_per_s"]
    assert curve["measure_P"] == [1, 4, 16, 64, 256, 1024]
    sweep_s = [m["sweep_s"] for m in curve["measure"]]
    predicted = [m["predicted_s"] for m in curve["measure"]]
    # each P: the untimed forward, then 3 timed ones, or as many as fit in the 3 s budget (at least one)
    forwards = [1 + min(3, max(1, int(sweep.BUDGET_S / s))) for s in predicted]
    assert forwards[0] == 4 and forwards[-1] == 2  # P = 1 and P = 1,024 (3.3 s a forward on this profile)
    assert sweep_s[-1] == pytest.approx(sum(n * s for n, s in zip(forwards, predicted, strict=True)))
    exact = costs.prefill_flops_exact(smollm.spec, 1024).total
    assert next(p for p in points if p["P"] == 1024)["flops"] == pytest.approx(exact, rel=1e-3)


def recording(threads: list, fn):
    """fn, noting the name of the thread each call runs on."""

    def recorded(*args, **kwargs):
        threads.append(threading.current_thread().name)
        return fn(*args, **kwargs)

    return recorded


def test_a_warm_measurement_at_P_4_sits_beside_its_prediction(url, curve, monkeypatch):
    threads = []
    monkeypatch.setattr(sweep, "warm_prefill", recording(threads, sweep.warm_prefill))
    r = post(url, {"P": 4})
    assert r.status_code == 200, r.text
    m = r.json()
    assert threads == ["prefill-worker"]  # the forwards ran between two steps of the serving loop
    assert m["P"] == 4 and m["measured_s"] > 0
    assert m["error"] == pytest.approx(m["predicted_s"] / m["measured_s"] - 1)
    assert m["predicted_s"] == next(p for p in curve["points"] if p["P"] == 4)["predicted_s"]
    assert m["measured_flops_per_s"] == pytest.approx(m["flops"] / m["measured_s"])
    assert m["intensity"] == pytest.approx(m["flops"] / m["bytes"])
    assert m["note"].startswith(f"P = 4: {m['dominant']}-bound") and "one untimed forward first" in m["note"]


@pytest.mark.parametrize(
    "body,words",
    [
        ({"P": 0}, ("P:", "greater than or equal to 1")),
        ({"P": -3}, ("P:",)),
        ({"P": "4"}, ("P:", "valid integer")),
        ({"P": 4.5}, ("P:", "valid integer")),  # 4.0 is 4, as for every integer field of the server
        ({"P": 1025}, ("P:", "less than or equal to 1024")),
        ({"P": 4, "repeats": 100}, ("repeats", "does not know this field")),
        ({}, ("P:", "required")),
    ],
)
def test_measure_refuses_bad_P(url, body, words):
    refused(post(url, body), *words)


def test_load_at_a_low_and_a_high_rate(url, capacity):
    low, high = (ok(url, "/api/load", rate=f * capacity) for f in (0.2, 0.9))
    for r in (low, high):
        assert r["ttft_p99_s"] >= r["ttft_p50_s"] > 0 and r["itl_p50_s"] > 0
        assert r["utilisation"] == pytest.approx(r["rate"] / capacity) and r["capacity_req_per_s"] == capacity
        assert r["explanation"].startswith(f"At {r['rate']:.3g} req/s") and "simulated clock" in r["explanation"]
    assert high["ttft_p50_s"] > low["ttft_p50_s"]  # queueing: the same mix, arriving faster
    curve = high["curve"]
    assert [c["rate"] for c in curve] == sorted(c["rate"] for c in curve) and len(curve) == len(load.FRACTIONS)
    assert curve[-1]["utilisation"] == pytest.approx(load.FRACTIONS[-1], rel=0.01)
    assert high["curve_range"] == [load.FRACTIONS[0], load.FRACTIONS[-1]]  # the slider reaches no rate off the curve
    assert ok(url, "/api/load")["utilisation"] == pytest.approx(load.DEFAULT_UTILISATION, rel=0.01)


def test_each_rate_is_simulated_once_on_a_thread_of_its_own(url, capacity, monkeypatch):
    threads = []
    monkeypatch.setattr(load, "simulate", recording(threads, load.simulate))
    rate = 0.333 * capacity  # on no curve point
    first = ok(url, "/api/load", rate=rate)
    again = ok(url, "/api/load", rate=rate * 1.0001)  # the same rate to 3 significant digits
    assert first.pop("asked") == rate and again.pop("asked") == rate * 1.0001  # each says what it asked
    assert first == again and len(threads) == 1
    assert threads[0] not in ("prefill-worker", "MainThread") and threads[0].startswith("asyncio")


@pytest.mark.parametrize(
    "rate,words", [(0, ("rate must be > 0",)), (-1, ("rate must be",)), ("nan", ("rate must be",)), ("abc", ("rate",))]
)
def test_load_refuses_a_bad_rate(url, rate, words):
    refused(get(url, "/api/load", rate=rate), *words)


@pytest.mark.parametrize(
    "asked,fraction", [(1e300, load.MAX_UTILISATION), (5e-324, load.MIN_UTILISATION), ("1e-300", load.MIN_UTILISATION)]
)
def test_a_rate_far_from_capacity_is_simulated_at_the_nearer_end(url, capacity, asked, fraction):
    """Any rate > 0 is schema-valid (the capacity is known only at run time): one outside 0.1% to 10x the capacity
    is simulated at the nearer end, and the answer says both rates (at 1e-300 req/s a step's seconds would vanish
    in the clock's rounding)."""
    r = ok(url, "/api/load", rate=asked)
    assert r["rate"] == load.three_digits(fraction * capacity) and r["asked"] == float(asked)
    assert r["utilisation"] == pytest.approx(fraction, rel=0.01) and r["ttft_p50_s"] > 0


def test_the_document_says_what_load_does_with_a_far_rate(url):
    (rate,) = httpx.get(f"{url}/openapi.json").json()["paths"]["/api/load"]["get"]["parameters"]
    assert rate["schema"]["exclusiveMinimum"] == 0 and "maximum" not in rate["schema"]  # any rate > 0 is valid
    assert "simulated at the nearer end" in rate["description"] and "0.1% to 10x" in rate["description"]


def test_compute_or_load_is_the_store_decision_at_every_length(url, smollm):
    """Each stored prefix length: the time model's prefill in the server's chunks beside its block files read at
    the rates measured once per server; the store's choice between them, where it flips, and the break-even rate."""
    from prefill.costmodel.kv_store import break_even_rate
    from prefill.engine.kv_store.format import header_size
    from prefill.server.app import ServeConfig

    r = ok(url, "/api/compute-or-load")
    spec, chunk = smollm.spec, ServeConfig("m").chunk_size
    assert r["available"] and r["block_tokens"] == 16
    kv = costs.kv_cache_bytes(spec.L, spec.H_kv, spec.d_head, 16, 4)  # one block of every layer, float32
    assert r["block_file_bytes"] == kv + header_size(spec.L, 16)
    Ps = [p["P"] for p in r["points"]]
    assert Ps[0] == 16 and Ps[-1] == spec.context_length and Ps == sorted(set(Ps)) and all(P % 16 == 0 for P in Ps)
    ram, disk = r["ram"]["bytes_per_s"], r["disk"]["bytes_per_s"] if r["disk"] else None
    for p in r["points"]:
        assert p["bytes"] == p["P"] // 16 * r["block_file_bytes"]
        assert p["compute_s"] == pytest.approx(smollm.predict_prefill(p["P"], 0, chunk, profile=FIXED).seconds)
        assert p["ram_s"] == pytest.approx(p["bytes"] / ram)
        assert p["ram_choice"] == ("load" if p["ram_s"] < p["compute_s"] else "compute")
        if disk:
            assert p["disk_s"] == pytest.approx(p["bytes"] / disk)
    for tier in ("ram", "disk"):
        if r[tier] is not None and not r[tier]["flips"]:
            assert len({p[f"{tier}_choice"] for p in r["points"]}) == 1
    assert r["break_even_bytes_per_s"] == pytest.approx(
        break_even_rate([p["bytes"] for p in r["points"]], [p["compute_s"] for p in r["points"]])[0]
    )
    at = max(r["points"], key=lambda p: p["bytes"] / p["compute_s"])
    assert r["break_even_P"] == at["P"] and r["break_even_bytes_per_s"] == pytest.approx(at["bytes"] / at["compute_s"])
    assert r["explanation"].startswith("Each token's K and V take ") and r["human"]["break_even"] in r["explanation"]
    assert ok(url, "/api/compute-or-load")["ram"]["bytes_per_s"] == ram  # measured once per server
