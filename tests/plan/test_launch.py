"""Launch lines deploy what was simulated: every flag is one the engine documents (tests/data/engine_args.json,
with its sources), every simulated setting is in the line, and the checkpoint is the Instruct one, pre-quantized
where the weights are FP8."""

from __future__ import annotations

import dataclasses
import json
import shlex
from pathlib import Path

import pytest

from prefill.costmodel.specs import PRESETS
from prefill.plan.gpu_serving import GpuServer
from prefill.plan.launch import INSTRUCT, QUANTIZED, launch_for

ARGS = json.loads((Path(__file__).parents[1] / "data" / "engine_args.json").read_text())
L8, L70 = PRESETS["llama-3.1-8b"], PRESETS["llama-3-70b"]


def parse(engine: str, command: str) -> tuple[str, dict[str, str | None]]:
    """The line's checkpoint and its flags ({flag: value, or None for a switch}), each checked against the
    engine's documented table: a flag it does not document, or a value outside a flag's choices, fails."""
    table, words = ARGS[engine], shlex.split(command)
    assert words[: len(table["program"])] == table["program"], command
    words = words[len(table["program"]) :]
    model = words.pop(0) if table["model"] == "positional" else None
    flags: dict[str, str | None] = {}
    while words:
        flag = words.pop(0)
        assert flag in table["flags"], f"{engine} documents no {flag}"
        spec = table["flags"][flag]
        value = None if spec.get("type") == "flag" else words.pop(0)
        if "choices" in spec:
            assert value in spec["choices"], f"{engine} {flag} {value}: not one of {spec['choices']}"
        elif spec.get("type") in ("int", "float"):
            float(value)  # a number, or ValueError
        flags[flag] = value
    model = model or flags.pop(table["model"])
    return model, flags


def yaml_values(files) -> dict[str, str]:
    """The launch's YAML file as dotted keys ("kv_cache_config.dtype": "fp8"): two levels, as written."""
    (_, text), values, section = files[0], {}, ""
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        if line.startswith(" "):
            values[f"{section}.{key}"] = value.strip()
        elif value.strip():
            values[key] = value.strip()
        else:
            section = key
    return values


def check_settings(server: GpuServer, launch) -> None:
    """Every simulated setting of `server` is in its launch, as its engine names it."""
    e, table = server.engine, ARGS[server.engine.name]
    model, flags = parse(e.name, launch.command)
    if launch.files:
        assert launch.files[0][0] == flags["--extra_llm_api_options"]
        values = yaml_values(launch.files)
        assert set(values) <= set(table["yaml"]) and all(v in table["yaml"][k]["choices"] for k, v in values.items())
        flags |= values
    said = {name: flags[flag] for name, flag in table["settings"].items() if flag in flags}
    assert int(said["tp"]) == server.tp and float(said["memory_fraction"]) == e.fraction(server.tp)
    assert int(said["max_seqs"]) == e.max_seqs and int(said["token_budget"]) == e.token_budget
    activations = said.get("activations", "bfloat16")  # TensorRT-LLM: the checkpoint's own (BF16 here)
    assert said["kv"] == table["kv"].get(server.kv, "auto")
    assert said["kv"] != "auto" or server.kv == activations  # auto: K/V in the activations' dtype
    quantized = {c.repo: c.weights for cs in QUANTIZED.values() for c in cs}
    if server.weights in ("fp8", "nvfp4", "mxfp4") and model in quantized:  # a pre-quantized checkpoint
        assert quantized[model] == server.weights and "online_quantization" not in said
    elif server.weights == "fp8":  # a BF16 checkpoint the engine quantizes to FP8 as it loads
        assert said["online_quantization"] == "fp8" and model == INSTRUCT[server.spec.name]
    else:
        assert model == INSTRUCT[server.spec.name] and activations == server.weights


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("weights, kv, tp", [("bfloat16", None, 1), ("fp8", "fp8", 2), ("fp8", None, 1)])
def test_each_line_has_only_documented_flags_and_every_simulated_setting(engine, weights, kv, tp):
    server = GpuServer.of(L8, "h100", engine, weights, kv, tp)
    launch = launch_for(server)
    assert launch.command and not launch.missing, launch
    check_settings(server, launch)


def test_a_70b_fp8_plan_names_a_pre_quantized_checkpoint_not_the_bf16_one():
    """141 GB of BF16 weights do not load on one H200 to be quantized there: the line names the FP8 checkpoint;
    TensorRT-LLM loads only ModelOpt checkpoints, and none of Llama 3 70B is known, so it says so."""
    for engine in ("vllm", "sglang"):
        server = GpuServer.of(L70, "h200", engine, "fp8", "fp8", 1)
        launch = launch_for(server)
        assert "neuralmagic/Meta-Llama-3-70B-Instruct-FP8" in launch.command and "--quantization" not in launch.command
        check_settings(server, launch)
    trt = launch_for(GpuServer.of(L70, "h200", "trtllm", "fp8", "fp8", 1))
    assert not trt.command and "no pre-quantized fp8 checkpoint" in trt.missing


def test_without_a_pre_quantized_checkpoint_fp8_is_quantized_online_only_where_bf16_loads():
    custom = dataclasses.replace(L70, name="someone/Custom-70B")  # no checkpoint of it in the tables
    tp4 = GpuServer.of(custom, "h100", "vllm", "fp8", None, 4)  # 35 GB of BF16 a GPU: loads, then quantized
    launch = launch_for(tp4)
    assert "vllm serve someone/Custom-70B " in launch.command and "--quantization fp8" in launch.command
    parse("vllm", launch.command)
    tp1 = launch_for(GpuServer.of(custom, "h200", "vllm", "fp8", None, 1))  # 141 GB of BF16 on one H200
    assert not tp1.command and "do not load" in tp1.missing


def test_every_preset_launches_its_chat_checkpoint():
    assert {spec.name for spec in PRESETS.values()} <= set(INSTRUCT)
    for base, chat in INSTRUCT.items():
        assert chat == base or any(w in chat for w in ("Instruct", "-it", "chat")), chat
    assert INSTRUCT["meta-llama/Llama-3.1-8B"] == "meta-llama/Llama-3.1-8B-Instruct"


def test_our_server_line_uses_its_own_options_and_refuses_what_it_cannot_run():
    import typer

    from prefill.cli.main import app

    options = {o for p in typer.main.get_command(app).commands["serve"].params for o in p.opts}
    server = GpuServer.of(L8, "h100", "prefill", "bfloat16", None, 1)
    words = shlex.split(launch_for(server).command)
    assert words[:2] == ["prefill", "serve"] and set(words[2::2]) <= options
    said = dict(zip(words[2::2], words[3::2], strict=True))
    assert int(said["--max-running"]) == server.engine.max_seqs and int(said["--chunk-size"]) == 256
    kv_mb = server.tokens * 2 * L8.L * L8.H_kv * L8.d_head * 2 / 2**20  # the simulated positions' K/V
    assert float(said["--kv-cache-mb"]) == pytest.approx(kv_mb, abs=0.5)
    assert said["--weights"] == said["--kv-dtype"] == "bfloat16"
    assert "one GPU" in launch_for(GpuServer.of(L8, "h100", "prefill", "bfloat16", None, 2)).missing
