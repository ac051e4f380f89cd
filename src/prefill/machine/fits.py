"""Fitted profiles: the efficiencies and rates a benchmark fitted to its measurements, saved per machine, dtype,
model and weights, and applied over the quick probe's profile (prefill.machine.profiles.profile_for).

    save_fitted(spec, profile)              remember a fitted profile for this machine, dtype and model
    with_fit(profile, spec, device, ...)    `profile` with the saved fit for it, if any (and still current)
"""

from __future__ import annotations

import time

from prefill.costmodel.profile import MachineProfile
from prefill.costmodel.specs import ModelSpec
from prefill.device.cache import read_json, write_json
from prefill.machine.entries import current, entry_key, stamp

FITTED_FILE = "fitted.json"  # fitted parameters, per machine key, dtype and model
FITTED_FIELDS = ("gemm_efficiency", "attention_efficiency", "bandwidth_bytes_per_s", "cache_bandwidth_bytes_per_s")
FITTED_FIELDS += ("op_overhead_s", "step_overhead_s", "source", "kind")


def _fit_key(spec: ModelSpec, device: str, threads: int | None, dtype: str, qtypes: dict[str, str]) -> str:
    """A fit's name: machine, dtype, model, and the weights' GGUF types where blocks are kept (a fit of the
    dense weights says nothing of the block kernels, nor the other way round)."""
    blocks = f"|{','.join(sorted(set(qtypes.values())))}" if qtypes else ""
    return f"{entry_key(device, threads, dtype)}|{spec.name}{blocks}"


def with_fit(
    profile: MachineProfile, spec: ModelSpec, device: str, threads: int | None, qtypes: dict[str, str]
) -> MachineProfile:
    """`profile` with the parameters a benchmark fitted for this machine, its dtype, `spec` and weights, if any."""
    saved = read_json(FITTED_FILE).get(_fit_key(spec, device, threads, profile.dtype, qtypes))
    if not saved or not current(saved):  # a fit of another probe's curves, or of other kernels, does not apply
        return profile
    fitted = profile.with_fit(**{k: saved[k] for k in FITTED_FIELDS if k in saved})
    if saved.get("source", "").endswith(f"({profile.source})"):
        return fitted  # the probe it was fitted on
    return fitted.with_fit(source=f"{profile.source}, with the fit of {saved.get('saved', 'a benchmark')}")


def save_fitted(
    spec: ModelSpec,
    profile: MachineProfile,
    device: str = "cpu",
    threads: int | None = None,
    qtypes: dict[str, str] | None = None,
) -> None:
    """Remember `profile`'s fitted parameters for this machine, its dtype, `spec` and weights (`qtypes` as
    probe_profile's; profile_for applies them)."""
    data = read_json(FITTED_FILE)
    row = {k: getattr(profile, k) for k in FITTED_FIELDS}
    saved = {**row, "saved": time.strftime("%Y-%m-%d %H:%M"), **stamp()}
    data[_fit_key(spec, device, threads, profile.dtype, qtypes or {})] = saved
    write_json(FITTED_FILE, data)
