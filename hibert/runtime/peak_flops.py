"""The dense bf16 peak a GPU's MFU is counted against, chosen by stated rules from the name torch reports, its
memory and its SM count. Standard library only: the runtime's MFU (metrics.py) and the device suite's
(benchmarks/device_mfu.py, which loads this file by path on a bare node) use the same table."""
from __future__ import annotations

import re
from typing import Any

# Dense (not 2:4-sparse) bf16 tensor-core TFLOP/s from NVIDIA's data sheets, most specific rule first. H200 and H100
# come in an SXM part (989) and lower-clocked NVL / PCIe parts under almost the same name; where the name does
# not say which, the memory (H100 NVL: 94 GB) and the SM count (H100 PCIe: 114, the others 132) do.
PEAKS: tuple[tuple[str, str, float], ...] = (
    (r"\bGH200\b", "GH200", 989.0),
    (r"\bH200\b.*\bNVL\b", "H200 NVL", 835.0),
    (r"\bH200\b", "H200 SXM", 989.0),
    (r"\bH100\b.*\bNVL\b", "H100 NVL", 835.0),
    (r"\bH100\b.*\bPCIe\b", "H100 PCIe", 756.0),
    (r"\bH100\b.*\b(SXM|HBM3)", "H100 SXM", 989.0),
    (r"\bH20\b", "H20", 148.0),
    (r"\bB200\b", "B200", 2250.0),
    (r"\bA100\b", "A100", 312.0),
    (r"\bL40S\b", "L40S", 362.0),
    (r"\bL40\b", "L40", 181.0),
    (r"\bL4\b", "L4", 121.0),
    (r"\bA10\b", "A10", 125.0),
    (r"\bV100\b", "V100", 125.0),
)
H100_BY_SHAPE = (("H100 NVL", 835.0), ("H100 PCIe", 756.0), ("H100 SXM", 989.0))


def peak_tflops(name: str, memory_gib: float | None = None, sms: int | None = None) -> dict[str, Any]:
    """The peak MFU is counted against, and the rule that chose it (recorded with every MFU the suite reports)."""
    facts = {"name": name, "memory_gib": memory_gib, "multiprocessors": sms}
    for pattern, gpu, tflops in PEAKS:
        if re.search(pattern, name, re.IGNORECASE):
            return {**facts, "tflops": tflops, "gpu": gpu, "rule": f"name matches /{pattern}/"}
    if re.search(r"\bH100\b", name):   # a bare "H100": the memory or the SM count tells the parts apart
        if memory_gib is not None and 88 <= memory_gib < 100:
            (gpu, tflops), rule = H100_BY_SHAPE[0], f"H100 with {memory_gib} GiB (NVL: 94 GB)"
        elif sms == 114:
            (gpu, tflops), rule = H100_BY_SHAPE[1], "H100 with 114 SMs (PCIe)"
        else:
            (gpu, tflops), rule = H100_BY_SHAPE[2], f"H100, {memory_gib} GiB, {sms} SMs: taken as SXM"
        return {**facts, "tflops": tflops, "gpu": gpu, "rule": rule}
    return {**facts, "tflops": None, "gpu": None, "rule": f"no rule for {name!r}: MFU not computed "
                                                          "(tracking.peak_tflops sets it)"}
