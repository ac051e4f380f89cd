"""The lesson API's bounds: the document and the checks read one table (prefill.lesson.limits.RANGES), and every
request at the documented ends of the numbers is answered 200 with finite numbers (a peak / bandwidth ridge, 1 /
ITL, a guess / a measurement): no schema-valid request refused for the float64 arithmetic behind it."""

from __future__ import annotations

import math

import httpx
import pytest
from test_lesson_api import ok

from prefill.lesson.limits import RANGES
from prefill.lesson.live import PREDICT_RANGES

pytestmark = pytest.mark.slow
# Each route's numbers and the entry of RANGES that bounds them (the document's own name for the parameter).
ROUTES = {
    "/api/estimate": {"N": "N", "P": "P", "n": "n", "peak": "peak", "mfu": "mfu", "bandwidth": "bandwidth"},
    "/api/request": {"ttft": "ttft", "itl": "itl", "n": "n"},
    "/api/predict": PREDICT_RANGES,
}


@pytest.fixture(scope="module")
def params(url) -> dict[str, dict[str, dict]]:
    """Each route's documented query parameters by name: their schema (the number member of an optional one)."""
    paths = httpx.get(f"{url}/openapi.json").json()["paths"]
    out = {}
    for path in ROUTES:
        out[path] = {}
        for p in paths[path]["get"]["parameters"]:
            schema = p["schema"]
            number = next((s for s in schema.get("anyOf", []) if s.get("type") != "null"), schema)
            out[path][p["name"]] = {**number, **{k: v for k, v in schema.items() if k != "anyOf"}}
    return out


def ends(schema: dict) -> tuple[float, float]:
    """The least and the greatest value the schema allows (the next float above an exclusive minimum)."""
    lo = schema["minimum"] if "minimum" in schema else math.nextafter(schema["exclusiveMinimum"], math.inf)
    return lo, schema["maximum"]


def test_the_document_states_the_tables_bounds(params):
    for path, names in ROUTES.items():
        for name, entry in names.items():
            r, schema = RANGES[entry], params[path][name]
            assert ends(schema) == (r.lo, r.hi), (path, name)
            assert "exclusiveMinimum" not in schema, (path, name)  # each least value is a physical one


@pytest.mark.parametrize("path", list(ROUTES))
@pytest.mark.parametrize("end", [0, 1])
def test_every_number_at_its_documented_end_is_answered(url, params, path, end):
    """All at their least, all at their greatest, and each alone at either end: 200 and finite (on the old bounds:
    itl = 5e-324 overflowed 1 / ITL, bandwidth = 5e-324 the ridge)."""
    at = {name: ends(params[path][name])[end] for name in ROUTES[path]}
    extra = {"P": 1, "itl": [0.0, 3600.0]} if path == "/api/predict" else {}
    cases = [at] + [{name: value} for name, value in at.items()]
    for case in cases:  # 200: the JSON response refuses inf and NaN (allow_nan=False), so every number is finite
        ok(url, path, **extra, **case)


def test_estimate_at_the_least_bandwidth_and_the_greatest_peak_has_a_finite_ridge(url):
    r = ok(url, "/api/estimate", peak=RANGES["peak"].hi, bandwidth=RANGES["bandwidth"].lo, model="llama-3-8b")
    assert r["roofline"]["ridge"] == pytest.approx(RANGES["peak"].hi / RANGES["bandwidth"].lo) == 1e10


def test_gaps_of_no_time_still_give_the_request_time(url):
    """Two tokens in one network read are measured 0 s apart: the request time TTFT + (n - 1) · mean ITL is still
    given (before: a 400 for the decode rate 1 / 0 it did not need)."""
    r = ok(url, "/api/predict", P=3, n=3, itl=[0.0, 0.0], ttft_s=0.5)
    assert r["request_model_s"] == 0.5 and r["itl_p50_s"] == 0 and "itl_error" not in r
