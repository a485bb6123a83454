"""The GPUs a run can be planned for: the memory each reports, and what is left for tensors.

    usable_bytes("H100-80GB")        # 84,508,606,464 B (78.7 GiB): the device's memory less CUDA's own
    parse_gpu("nvidia h100 80gb hbm3").total_bytes    # 85,045,477,376 B

`total_bytes` is the memory as the device reports it (cudaGetDeviceProperties' totalGlobalMem, which is
`torch.cuda.get_device_properties(0).total_memory`): less than the marketed size (an "80 GB" H100 reports
79.2 GiB) and than nvidia-smi's total. Each value is one published capture, cited in `source`.

`overhead_bytes` is what the process takes before the first tensor, outside PyTorch's caching allocator:
CUDA_OVERHEAD = 512 MiB by default (the CUDA context, about 300-400 MB with lazy module loading, and library
workspaces, rounded up). It is an assumption, not a measurement: pass overhead_bytes (`Device(...,
overhead_bytes=...)`) to use one, and add NCCL's buffers for a distributed run. Sources: docs/house.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..units import format_bytes

MiB = 2**20
CUDA_OVERHEAD = 512 * MiB


@dataclass(frozen=True)
class Device:
    """One GPU: its name here, the name CUDA reports, its total_memory in bytes and where that number is from."""

    name: str
    reports: str  # torch.cuda.get_device_name(0)
    total_bytes: int
    source: str
    overhead_bytes: int = CUDA_OVERHEAD

    @property
    def usable_bytes(self) -> int:
        """What tensors can get: total_bytes less the CUDA context and library workspaces."""
        return self.total_bytes - self.overhead_bytes

    def __str__(self) -> str:
        return (f"{self.name} ({self.reports}): {format_bytes(self.total_bytes)} reported, "
                f"{format_bytes(self.usable_bytes)} for tensors")


_DEVICES = (
    Device("A100-40GB", "NVIDIA A100-SXM4-40GB", 42_405_855_232,
           "deviceQuery on an A100 40GB SXM4 (Paderborn PC2 documentation, "
           "upb-pc2.atlassian.net/wiki/spaces/PC2DOK/pages/1900609); PyTorch prints total_memory=40536MB elsewhere"),
    Device("A100-80GB", "NVIDIA A100-SXM4-80GB", 85_100_068_864,
           "deviceQuery, driver 12.5 (github.com/thamada/nvidia-smi, gls/A100SXMx4_deviceQuery.py); "
           "84,987,740,160 B under driver 12.2 in another capture"),
    Device("H100-80GB", "NVIDIA H100 80GB HBM3", 85_045_477_376,
           "deviceQuery, driver 12.7 (github.com/thamada/nvidia-smi, nvsim/H100SXMx8_deviceQuery.py); PyTorch "
           "prints total_memory=81082MB to 81090MB across drivers"),
    Device("H200", "NVIDIA H200", 143_156 * MiB,
           "torch.cuda.get_device_properties(0) printing total_memory=143156MB (whole MiB, rounded down) on a "
           "cloud H200; nvidia-smi shows 143771MiB"),
    Device("RTX-4090", "NVIDIA GeForce RTX 4090", 25_386_352_640,
           "deviceQuery, driver 12.4 (github.com/thamada/nvidia-smi, gls/RTX4090_deviceQuery.py)"),
    Device("RTX-3090", "NVIDIA GeForce RTX 3090", 25_327_697_920,
           "deviceQuery, driver 12.6 (github.com/thamada/nvidia-smi, gls/RTX3090_deviceQuery.py); PyTorch "
           "prints total_memory=24268MB in Hugging Face's docs"),
)
DEVICES = {d.name: d for d in _DEVICES}


def _key(text: str) -> str:
    """'NVIDIA GeForce RTX 4090', 'rtx 4090', 'RTX-4090' -> 'rtx4090'; 'h100_80gb' -> 'h10080gb'."""
    key = re.sub(r"[^a-z0-9]", "", str(text).lower())
    return re.sub(r"^(nvidia)?(geforce)?", "", key)


_ALIASES = {}
for _d in _DEVICES:
    for _alias in (_d.name, _d.reports, _d.reports.replace("-SXM4", "")):
        _ALIASES[_key(_alias)] = _d
_ALIASES[_key("H100")] = DEVICES["H100-80GB"]
_ALIASES[_key("H200-141GB")] = DEVICES["H200"]


def parse_gpu(name) -> Device:
    """The Device for a name as people write it: 'H100-80GB', 'h100 80gb', 'NVIDIA H100 80GB HBM3', 'rtx4090'
    (case, spaces, dashes and an 'NVIDIA'/'GeForce' prefix do not matter); a Device is returned as it is."""
    if isinstance(name, Device):
        return name
    device = _ALIASES.get(_key(name))
    if device is None:
        known = ", ".join(DEVICES)
        hint = " (A100 comes in two sizes: A100-40GB or A100-80GB)" if _key(name) == "a100" else ""
        raise ValueError(f"unknown GPU {name!r}{hint}: known are {known}")
    return device


def usable_bytes(name) -> int:
    """The bytes tensors can get on that GPU: the memory it reports less CUDA_OVERHEAD (see the module)."""
    return parse_gpu(name).usable_bytes
