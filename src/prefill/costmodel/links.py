"""The links a disaggregated deployment ships each prompt's K/V over, prefill GPUs to decode GPUs, and the time it
takes. Torch-free.

    link = get_link("ib-ndr")
    s = kv_transfer_seconds(spec, P=4000, kv_bytes=2, tp_prefill=1, tp_decode=1, link=link)  # one prompt's K/V

The bytes are the KV formula's (prefill.costmodel.parallel.tp_kv_cache_bytes_per_gpu over costs.kv_cache_bytes_for);
each GPU of the narrower TP group sends or receives its share of the heads over its own link at once (vLLM's
NixlConnector and SGLang's Mooncake transfer engine move each TP rank's blocks rank to rank), so a prompt's
transfer takes latency + share / bandwidth. A link carries one transfer at a time; the simulator queues the next.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefill.costmodel.costs import _non_negative, _positive
from prefill.costmodel.parallel import tp_kv_cache_bytes_per_gpu
from prefill.costmodel.specs import ModelSpec
from prefill.errors import BadInput

GB = 1e9


@dataclass(frozen=True)
class Link:
    """One GPU's link to a GPU of the other pool: bytes/s per direction (the line rate), the seconds a transfer
    waits before its first byte arrives (latency: the fabric's and the transfer engine's setup), and the sources."""

    name: str
    bytes_per_s: float
    latency_s: float
    source: str

    def seconds(self, nbytes: float) -> float:
        """Seconds to move `nbytes` over this link: latency + bytes / bandwidth."""
        return self.latency_s + _non_negative("nbytes", nbytes) / self.bytes_per_s


# Bandwidths are per GPU and per direction, as the datasheets give them; a transfer is taken to reach the line
# rate (an upper bound: NIXL and Mooncake report 80-95% of it on large blocks). Latencies are estimates: a few us
# for the fabric plus the transfer engine's per-request setup (descriptors, a notification), which no engine
# publishes as one figure; at these sizes (tens to hundreds of MB a prompt) the bandwidth term dominates.
LINKS: dict[str, Link] = {
    "nvlink": Link(
        "NVLink 4 (same node)",
        450 * GB,
        20e-6,
        "NVIDIA H100/H200 SXM datasheets: NVLink 900 GB/s per GPU, both directions together (450 GB/s each way)",
    ),
    "nvlink3": Link(
        "NVLink 3 (same node, A100)",
        300 * GB,
        20e-6,
        "NVIDIA A100 datasheet: NVLink 600 GB/s per GPU, both directions together (300 GB/s each way)",
    ),
    "ib-ndr": Link(
        "InfiniBand NDR 400 Gb/s (between nodes)",
        50 * GB,
        50e-6,
        "NVIDIA DGX H100 datasheet: 8 x ConnectX-7 400 Gb/s InfiniBand/Ethernet, one a GPU (400 Gb/s = 50 GB/s)",
    ),
    "roce-400g": Link(
        "RoCE 400 GbE (between nodes)",
        50 * GB,
        100e-6,
        "ConnectX-7 at 400 GbE (DGX H100 datasheet); RoCE's latency above InfiniBand's (an estimate)",
    ),
    "ib-hdr": Link(
        "InfiniBand HDR 200 Gb/s (between nodes)",
        25 * GB,
        50e-6,
        "NVIDIA DGX A100 datasheet: 8 x ConnectX-6 200 Gb/s HDR InfiniBand, one a GPU (25 GB/s)",
    ),
    "eth-25g": Link(
        "Ethernet 25 Gb/s (between nodes)",
        25 * GB / 8,
        100e-6,
        "DistServe (Zhong et al., OSDI 2024, section 6.1): its A100 nodes' cross-node bandwidth, 25 Gbps",
    ),
}


def get_link(name: str) -> Link:
    """A link by name; BadInput naming the choices otherwise."""
    key = name.lower()
    if key not in LINKS:
        raise BadInput(f"unknown link {name!r}; choose one of: {', '.join(LINKS)}")
    return LINKS[key]


def kv_transfer_bytes(spec: ModelSpec, P: int, kv_bytes: float, tp_prefill: int, tp_decode: int) -> int:
    """Bytes each link carries for one prompt of P tokens: one GPU's share of its K/V in the narrower of the two
    TP groups (the wider group's GPUs each send or take a part of it). Equals the whole prompt's K/V
    (costs.kv_cache_bytes_for) when either pool runs TP 1."""
    return tp_kv_cache_bytes_per_gpu(spec, P, kv_bytes, min(tp_prefill, tp_decode))


def kv_transfer_seconds(spec: ModelSpec, P: int, kv_bytes: float, tp_prefill: int, tp_decode: int, link: Link) -> float:
    """Seconds to ship one prompt's K/V (P tokens, `kv_bytes` a element) from a prefill group of `tp_prefill` GPUs
    to a decode group of `tp_decode`, every GPU pair at once over `link`."""
    _positive("P", P)
    return link.seconds(kv_transfer_bytes(spec, P, kv_bytes, tp_prefill, tp_decode))
