"""glibc's heap held (prefill.machine.heap): glibc takes the three settings, and every engine asks for them.
(The slow state they remove is measured on a server, docs/performance.md; a synthetic arena in a test did not
reproduce glibc's heap deletion reliably, so the test checks the settings, not the timing.)"""

import pytest

from prefill.machine import heap


@pytest.mark.skipif(heap.glibc() is None, reason="needs glibc")
def test_glibc_takes_every_setting():
    heap.keep_freed_memory.cache_clear()
    assert heap.keep_freed_memory()  # mallopt returned 1 for each: none above glibc's limits


def test_a_new_engine_holds_the_heap(monkeypatch, smollm):
    calls = []
    monkeypatch.setattr(heap, "keep_freed_memory", lambda: calls.append(1) or True)
    from prefill.engine.llm import Engine

    Engine(smollm.runner, smollm.tokenizer, smollm.source)
    assert calls == [1]
