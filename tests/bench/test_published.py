"""The results files behind docs/performance.md: their kind names, their checks, their round trip, and a
bench.json published with the machine it names."""

import dataclasses
import datetime
import json

import pytest

from prefill.bench import published, report
from prefill.bench.published import Machine, Result, kind_slug
from prefill.errors import BadInput


def result(**changes) -> Result:
    fields = dict(
        benchmark="serving_core",
        kind="zen3-avx2",
        title="The serving core",
        machine=Machine(name="AMD EPYC (Zen 3)", kind="AVX2", flags=("avx2",), cores=2, threads=2, torch="2.13.0"),
        command=".venv/bin/python benchmarks/serving_core.py --rounds 3",
        date="2026-12-02",
        commit="072e4c4",
        columns=("case", "tok/s"),
        rows=(("1 stream", "18.7"), ("8 streams", "89.2")),
        headline=("8 streams 4.76x the output tok/s of one",),
        plot={"x": "case", "y": ["tok/s"]},
    )
    return Result(**(fields | changes))


@pytest.mark.parametrize(
    ("name", "kind", "family", "slug"),
    [
        ("AMD EPYC 7B13 64-Core Processor", "AVX2", 25, "zen3-avx2"),
        ("AMD EPYC 9R14 96-Core Processor", "AVX512-BF16", 25, "zen4-avx512-bf16"),
        ("AMD EPYC", "AVX512-BF16", 26, "zen5-avx512-bf16"),
        ("Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "AMX", 6, "xeon-avx512-amx"),
        ("Intel(R) Xeon(R) Processor", "AVX512-BF16", 6, "xeon-avx512-bf16"),
        ("NVIDIA H200", "CUDA", None, "h200"),
        ("NVIDIA GeForce RTX 4090", "CUDA", None, "rtx-4090"),
    ],
)
def test_a_kind_names_the_core_family_and_its_matrix_hardware(name, kind, family, slug):
    assert kind_slug(name, kind, family) == slug


def test_the_cpu_family_is_read_from_cpuinfo():
    assert published.cpu_family("processor : 0\ncpu family\t: 26\nmodel\t\t: 2\n") == 26
    assert published.cpu_family("processor : 0\n") is None


def test_a_results_file_round_trips_and_keeps_one_row_a_line(tmp_path):
    r = result()
    path = published.write(r, tmp_path)
    assert path == tmp_path / "zen3-avx2" / "serving_core.json"
    assert published.load(path) == r
    text = path.read_text()
    assert '  ["1 stream", "18.7"],\n  ["8 streams", "89.2"]\n' in text and json.loads(text)["format"] == 1
    assert published.load_all(tmp_path) == {"zen3-avx2": [r]}


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"rows": (("1 stream",),)}, "has 1 cells for 2 columns"),
        ({"kind": "Zen 3"}, "kind 'Zen 3' must be lower-case words"),
        ({"benchmark": "serving-core"}, "must be lower-case letters, digits and '_'"),
        ({"date": "2 Dec 2026"}, "must be YYYY-MM-DD"),
        ({"rows": ()}, "needs columns and at least one row"),
        ({"plot": {"x": "P", "y": ["tok/s"]}}, "must name columns (not ['P'])"),
    ],
)
def test_a_malformed_results_file_is_refused_by_name(changes, words):
    with pytest.raises(BadInput, match=words.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        result(**changes)


def test_a_file_in_the_wrong_folder_or_format_is_refused(tmp_path):
    path = published.write(result(), tmp_path)
    moved = tmp_path / "zen4-avx512-bf16" / "serving_core.json"
    moved.parent.mkdir()
    path.rename(moved)
    with pytest.raises(BadInput, match="says kind 'zen3-avx2'"):
        published.load(moved)
    moved.write_text(json.dumps({**json.loads(moved.read_text()), "format": 2}))
    with pytest.raises(BadInput, match="format 2: this version reads format 1"):
        published.load(moved)


def test_the_command_drops_the_publish_option_and_its_folder():
    script = str(published.ROOT / "benchmarks" / "predict.py")
    argv = [script, "--threads", "2", "--publish", "/tmp/x", "--repeats", "3"]
    assert published.command_line(argv) == ".venv/bin/python benchmarks/predict.py --threads 2 --repeats 3"
    assert published.command_line(["benchmarks/x.py", "--publish"]) == ".venv/bin/python benchmarks/x.py"


def test_publish_writes_this_machine_today_at_this_commit(tmp_path):
    path = published.publish(tmp_path, "demo", "A demo", ["a", "b"], [[1, "2"]], command="demo --x")
    r = published.load(path)
    kind, machine = published.this_machine()
    assert path.parent.name == kind == r.kind and r.machine.name == machine.name and r.machine.kind == machine.kind
    assert r.date == datetime.date.today().isoformat() and r.commit == published.git_commit()
    assert r.rows == ((1, "2"),) and r.command == "demo --x"


def bench_json() -> dict:
    """A bench.json's fields as prefill.bench.report.to_json writes them, for two points of ours and a peer."""

    def m(engine, P, median_s):
        return dict(engine=engine, dtype="float32", P=P, chunk_size=None, median_s=median_s, p90_s=median_s * 1.1,
                    tokens_per_s=P / median_s, mfu=0.5, predicted_s=median_s * 0.9, calibrated_s=None,
                    predicted_bound="compute")  # fmt: skip

    machine = dict(cpu="AMD EPYC 7B13", capability="AVX2", isa="AVX2", native_dtypes=["float32"], cores=2,
                   threads=2, device="cpu", torch="2.13.0+cpu", transformers="5.24.0", llama_cpp=None,
                   load_average_5min=0.4, cpu_family=25, flags=["avx2", "fma"])  # fmt: skip
    config = dict(prompt_lengths=[128, 512], dtypes=["float32"], repeats=3, peers=["transformers"], threads=2)
    return dict(model="/x/SmolLM2-135M-Instruct.Q4_1.gguf", spec={"name": "smollm2"}, config=config, machine=machine,
                gemm_flops_per_s={"float32": 8.2e10}, calibrations={}, notes=["a note"],
                measurements=[m("prefill", 128, 0.25), m("transformers", 128, 0.5), m("prefill", 512, 1.0),
                              m("transformers", 512, 1.5)])  # fmt: skip


def test_a_bench_json_is_published_with_the_machine_it_names(tmp_path):
    r = published.load(report.publish(bench_json(), tmp_path, date="2026-12-01", commit="abc1234"))
    assert r.kind == "zen3-avx2" and r.benchmark == "bench" and r.machine.flags == ("avx2", "fma")
    assert r.command == (
        "prefill bench --prompt-lengths 128,512 --dtypes float32 --repeats 3 --peers transformers --threads 2"
    )
    i, j = r.columns.index("transformers tok/s"), r.columns.index("vs transformers")
    assert [(row[1], row[i], row[j]) for row in r.rows] == [("128", "256", "2.00x"), ("512", "341", "1.50x")]
    assert not r.machine.shared and r.notes == "A note."
    shared = dataclasses.replace(r, machine=dataclasses.replace(r.machine, shared=True))  # still a valid file
    assert published.load(published.write(shared, tmp_path)).machine.shared


def test_a_llama_bench_run_is_published_with_our_speed_over_llama_cpps(tmp_path):
    from prefill.bench import versus

    def row(test, engine, seconds, tok, step_bytes=None, floor_s=None, predicted_s=None):
        return dict(test=test, threads=1, engine=engine, seconds=seconds, tokens_per_s=tok, step_bytes=step_bytes,
                    floor_s=floor_s, predicted_s=predicted_s)  # fmt: skip

    machine = dataclasses.asdict(result().machine) | {"slug": "zen3-avx2"}
    config = dict(threads=[1], weights=["native"], repeats=5, clock="cpu")
    data = dict(config=config, machine=machine, bandwidth={"1": 15.0e9}, notes=[], rows=[
        row("pp 512", "prefill (Q4_1 + Q8_0)", 2.0, 256.0, predicted_s=2.2),
        row("pp 512", "llama.cpp (Q4_1 + Q8_0)", 5.0, 102.4),
        row("tg @ d64", "prefill (Q4_1 + Q8_0)", 0.02, 50.0, 99_500_000, 0.0066, 0.017),
        row("tg @ d64", "llama.cpp (Q4_1 + Q8_0)", 0.025, 40.0, 98_100_000, 0.0065)])  # fmt: skip
    r = published.load(versus.publish(data, tmp_path, date="2026-12-02", commit="8826b1c"))
    assert (
        r.kind == "zen3-avx2"
        and r.command == "prefill bench --llama-bench --repeats 5 --threads 1 --cpu-time --weights native"
    )
    cols = [r.columns.index(c) for c in ("test", "predicted ms", "error", "vs llama.cpp", "of floor")]
    assert [tuple(row[c] for c in cols) for row in r.rows] == [
        ("pp 512", "2200.00", "+10%", "2.50x", ""), ("pp 512", "", "", "", ""),
        ("tg @ d64", "17.00", "-15%", "1.25x", "33%"), ("tg @ d64", "", "", "", "26%"),
    ]  # fmt: skip
    assert r.notes.startswith("thread CPU time, medians; each engine's threads quiet before the next engine is timed")
    assert "read bandwidth measured in this run: 1 threads 15.0 GB/s" in r.notes


def test_the_report_command_prints_publishes_or_refuses_in_one_line(tmp_path, capsys):
    run = tmp_path / "bench.json"
    run.write_text(json.dumps(bench_json()))
    assert (
        report.main([str(run)]) == 0
        and "| fp32 | 128 | 250.0 / 275.0 | 512 | 50% | 256 | 2.00x |" in capsys.readouterr().out
    )
    assert (
        report.main([str(run), "--publish", str(tmp_path / "r"), "--commit", "abc1234", "--conditions", "quiet"]) == 0
    )
    r = published.load(tmp_path / "r" / "zen3-avx2" / "bench.json")
    assert (r.commit, r.machine.conditions, r.date) == ("abc1234", "quiet", datetime.date.today().isoformat())
    run.write_text("{}")
    assert report.main([str(run), "--publish", str(tmp_path / "r")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {run}: not a bench.json ('machine')")
