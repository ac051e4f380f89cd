"""`prefill plan --fit loadtest.json --hardware cpu`: a load test measured on this machine, its prediction rebuilt
from what the report saved, and the CPU profile's two efficiencies refit to it.

    report = json.loads(Path("loadtest.json").read_text())   # `prefill loadtest --predict --hardware cpu --out`
    server = saved_server(report)                             # the ServerModel the prediction ran
    fit = fit_cpu(server, records, in_flight=4)               # what moved, and the errors before and after
    print(fit.describe())

The one time model (prefill.costmodel.timemodel) on the machine's probed profile (prefill.machine.profiles),
as the load test's prediction read it: the report keeps the profile, the step loop's seconds and the server's own
time (prefill.plan.load_prediction.LoadPrediction.save), so the fit starts from the prediction that was printed.
The profile's own two efficiencies, multipliers on its measured rates: "attention" (attention_efficiency: it
moves a decode step, which reads every cached K/V, several times more than a prefill; on the embedded SmolLM2
at 2 in flight, halving it adds 17% to the mean TPOT and 5% to the mean TTFT) and "gemm" (gemm_efficiency: it
sets prefill, and decode too). The per-operation dispatch cannot be fit: ~3 us an op, tripling it moves neither
mean by 0.2%. Both start at the prediction's and stay within CPU_BOUNDS: another server's kernels (llama.cpp's)
may be faster than the probe's.
"""

from __future__ import annotations

import dataclasses

from prefill.costmodel.profile import MachineProfile
from prefill.errors import BadInput
from prefill.loadtest.client import RequestRecord
from prefill.loadtest.server_calibration import ServingCalibration
from prefill.plan.engine_fit import Fit, fit_means
from prefill.plan.load_prediction import server_of, simulate_load
from prefill.plan.simulate import ServerModel

CPU_BOUNDS = (0.05, 1.5)  # a probe's efficiencies are 1.0; a faster server than ours reaches a little beyond


def saved_server(report: dict, echo=None) -> ServerModel:
    """The ServerModel of the report's CPU prediction: the model, dtype, weights and KV pool it took the server to
    run (server_model rebuilds the layout), with the saved profile, step loop and server time put back."""
    predicted = report.get("predicted") or {}
    served = predicted.get("served")
    if not served or "machine_profile" not in predicted:
        why = "the load test has no CPU prediction to refit; run `prefill loadtest --predict --hardware cpu --out`"
        raise BadInput(why)
    try:
        server = server_of(served, echo)
        serving = ServingCalibration(**predicted["serving"])
        loop_s = tuple(float(x) for x in predicted["loop_s"])
    except (KeyError, TypeError, ValueError) as e:
        raise BadInput(f"the load test's prediction is not one `prefill loadtest --predict` wrote ({e})") from None
    profile = MachineProfile.from_json(predicted["machine_profile"])
    return dataclasses.replace(server, profile=profile, loop_s=loop_s, serving=serving)


def fit_cpu(server: ServerModel, records: list[RequestRecord], in_flight: int | None) -> Fit:
    """The attention and GEMM efficiencies of the profile (see the module docstring) that make the simulated
    trace's mean TTFT and TPOT the measured ones."""
    base = server.profile

    def run(values: dict[str, float]) -> list[RequestRecord]:
        profile = base.with_fit(gemm_efficiency=values["gemm"], attention_efficiency=values["attention"])
        return simulate_load(dataclasses.replace(server, profile=profile), records, in_flight).records

    return fit_means(run, records, {"attention": base.attention_efficiency, "gemm": base.gemm_efficiency}, CPU_BOUNDS)
