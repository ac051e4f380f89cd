"""What the lesson page's routes read (`request.app.state.lesson`): the server's engine, the name its OpenAI
routes answer to, the way onto the server's worker thread (every forward runs there), the scheduler's sizes (for
the simulated load), and this machine's rates."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from fastapi import Request

if TYPE_CHECKING:
    from prefill.costmodel.profile import MachineProfile
    from prefill.costmodel.specs import ModelSpec
    from prefill.engine.llm import Engine
    from prefill.engine.request import Request as Job

T = TypeVar("T")
OnWorker = Callable[[Callable[[], Any]], Future]  # prefill.server.worker.Worker.call


class MachineRates:
    """This device's measured GEMM rate (engine dtype) and memory bandwidth, measured once, on the worker thread
    (between two steps, so no forward competes with the measurement), on the first request that needs them."""

    def __init__(self, engine: Engine, on_worker: OnWorker) -> None:
        self.engine, self.on_worker = engine, on_worker
        self._rates: Future | None = None

    async def get(self) -> tuple[float, float, str]:
        """(peak FLOP/s, bandwidth bytes/s, where they come from). Called on the event loop only."""
        if self._rates is None or (self._rates.done() and self._rates.exception() is not None):
            self._rates = self.on_worker(self._measure)  # a failed measurement is tried again next time
        return await asyncio.wrap_future(self._rates)

    def _measure(self) -> tuple[float, float, str]:
        from prefill.costmodel.hardware import HARDWARE
        from prefill.machine.probe import measure_copy_bandwidth

        gemm = self.engine.gemm_rate()
        if self.engine.device.type == "cuda":
            import torch

            name = torch.cuda.get_device_name(self.engine.device).lower()
            for key, hw in HARDWARE.items():
                if key.split("-")[0] in name:
                    return gemm, hw.bandwidth_bytes_per_s, f"GEMM measured on {name}; bandwidth: {hw.source}"
        return gemm, measure_copy_bandwidth(), "measured on this machine: square GEMM and array copy"


@dataclass(eq=False)
class LessonState:
    """The page's view of the server: its model, `on_worker(fn)` to run model code on the worker thread, and its
    scheduler's sizes: the prefill chunk (tokens, None: unchunked), the most requests running at once, and the
    KV pool's capacity in tokens; and its step loop's requests (for a long prefill's progress). The server passes
    its own (ServeConfig's). They have no defaults here: the lesson does not import the server (imports run one
    way), and a copy of ServeConfig's would drift."""

    engine: Engine
    model_id: str
    on_worker: OnWorker
    chunk_size: int | None
    max_running: int
    pool_tokens: int
    requests: Callable[[], list[Job]]  # the step loop's waiting and running requests (read on the worker thread)
    rates: MachineRates = field(init=False)
    _parts: dict[Callable[[LessonState], Any], Any] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        self.rates = MachineRates(self.engine, self.on_worker)

    def part(self, make: Callable[[LessonState], T]) -> T:
        """The page's one `make(self)`, made on its first ask: the simulated load (prefill.lesson.load), the KV
        store's read rates (prefill.lesson.tiers). They are passed in, so this module imports neither."""
        if make not in self._parts:
            self._parts[make] = make(self)
        return self._parts[make]

    @property
    def spec(self) -> ModelSpec:
        return self.engine.spec

    @property
    def dtype(self) -> str:
        return str(self.engine.dtype).removeprefix("torch.")

    @property
    def kv_dtype(self) -> str:
        """What the engine's KV pool stores K/V as (costs.KV_DTYPES)."""
        return self.engine.kv_dtype_name

    async def run(self, fn: Callable[[], T]) -> T:
        """fn() on the worker thread, awaited from the event loop."""
        return await asyncio.wrap_future(self.on_worker(fn))

    async def profile(self) -> MachineProfile:
        """The engine's machine profile (what the time model reads), probed on the worker thread on first need."""
        return await self.run(self.engine.profile)


def lesson_of(request: Request) -> LessonState:
    return request.app.state.lesson
