"""prefill.engine.pages.populate: a tensor's pages made resident, its contents unchanged."""

import ctypes
import mmap
import sys

import pytest
import torch

from prefill.costmodel.specs import ModelSpec
from prefill.engine.kvcache import KVPool
from prefill.engine.pages import page_range, populate


def test_populate_changes_no_byte_of_a_tensor_in_use():
    t = torch.arange(3 * 1024 * 1024, dtype=torch.float32)  # 12 MiB, written: its pages exist
    before = t.clone()
    n = populate(t)
    assert torch.equal(t, before)
    if sys.platform.startswith("linux"):
        assert n >= t.numel() * 4 - 2 * 4096  # every whole page inside it (a kernel without the call: 0)
    assert populate(torch.empty(0)) == 0


MADV_DONTNEED = 4  # <sys/mman.h>: drop the pages; private anonymous memory reads as zeros after


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


def resident_fraction(t: torch.Tensor) -> float:
    """The share of the whole pages inside t's memory that are resident now (mincore(2): per page, exact)."""
    start, end = page_range(t)
    vec = ctypes.create_string_buffer((end - start) // mmap.PAGESIZE)
    assert _libc().mincore(start, end - start, vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec.raw) / len(vec.raw)


def drop_pages(t: torch.Tensor) -> None:
    """Give t's whole pages back to the kernel (its allocator may have handed out memory touched before)."""
    start, end = page_range(t)
    assert _libc().madvise(start, end - start, MADV_DONTNEED) == 0, ctypes.get_errno()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="MADV_POPULATE_WRITE and mincore are Linux's")
def test_a_pools_pages_are_resident_after_populate():
    spec = ModelSpec.from_preset("smollm2-135m")
    pool = KVPool.for_tokens(spec, 2048, torch.float32, "cpu")  # 94 MB, uninitialised
    drop_pages(pool.kv[0])  # none of its pages resident, whatever memory the allocator reused
    assert resident_fraction(pool.kv[0]) == 0.0
    n = pool.populate()
    if n == 0:
        pytest.skip("this kernel has no MADV_POPULATE_WRITE (Linux < 5.14)")
    assert n == pytest.approx(pool.allocated_bytes(), abs=2 * 4096 * len(pool.kv))
    assert resident_fraction(pool.kv[0]) == 1.0  # every page is there now, before any write
    assert all(t.data_ptr() == pool.kv[0][i, 0].data_ptr() for i, t in enumerate(pool.k))  # layers are views
