"""The memory tiers a plan places values in, from a device description or the host's caches.

Three tier roles, each a memory space of the IR:

    NPU_SRAM   the fast tier: weights and intermediates the compute units read at full speed
    NPU_CACHE  the middle tier: a DMA-fed cache, slower than SRAM, faster than DRAM
    DRAM0      off-chip memory: unbounded here; graph inputs and outputs live in it (the
               host writes inputs into, and reads outputs out of, host-visible memory)

For `npusim:DEVICE` the sizes and bandwidths come from the device file ([memory.sram],
[memory.cache], [memory.dram], [dma]). For the host backends (`cpu`, `reference`, ...) the fast
tier stands for the CPU's last-level cache (read from sysfs; 32 MB when it cannot be read) and
there is no middle tier. `workspace_mb` always overrides the fast tier's size: it is the
Executor's workspace.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import NpurunError

FAST, MID, SLOW = "NPU_SRAM", "NPU_CACHE", "DRAM0"
MB = 2 ** 20
DEFAULT_L2, DEFAULT_L3 = 1 * MB, 32 * MB  # when sysfs says nothing


@dataclass(frozen=True)
class TierSpec:
    space: str            # the IR memory space
    size: int | None      # bytes; None = unbounded
    bandwidth_gbps: float | None  # None where unknown (host caches)
    role: str             # what the tier stands for on this target


@dataclass(frozen=True)
class Tiers:
    target: str
    fast: TierSpec
    mid: TierSpec
    slow: TierSpec
    burst: int = 256      # DMA burst size, bytes (the `burst` hint of staged nodes)
    pipeline: int = 2     # DMA pipelining depth (2 = double buffering; the `pipeline` hint)

    def by_space(self) -> dict[str, TierSpec]:
        return {t.space: t for t in (self.fast, self.mid, self.slow)}


def host_caches() -> tuple[int, int]:
    """(L2 bytes per core, L3 bytes) of this machine, from sysfs; the defaults where unknown."""
    l2, l3 = DEFAULT_L2, DEFAULT_L3
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    try:
        for idx in base.glob("index*"):
            level = int((idx / "level").read_text())
            kind = (idx / "type").read_text().strip()
            size = _size((idx / "size").read_text().strip())
            if kind in ("Unified", "Data") and size:
                if level == 2:
                    l2 = size
                elif level == 3:
                    l3 = size
    except (OSError, ValueError):
        pass
    return l2, l3


def _size(s: str) -> int:
    mult = {"K": 2 ** 10, "M": MB, "G": 2 ** 30}.get(s[-1:].upper(), 1)
    return int(s.rstrip("KkMmGg")) * mult


def tiers_for(device=None, workspace_mb: float | None = None) -> Tiers:
    """Tiers of a device string (`cpu`, `npusim:x-elite-hexagon`), a loaded npusim Device,
    or None (the host)."""
    if workspace_mb is not None and (isinstance(workspace_mb, bool) or not isinstance(workspace_mb, (int, float))
                                     or workspace_mb <= 0):
        raise NpurunError(f"workspace_mb must be a positive number, got {workspace_mb!r}")
    ws = None if workspace_mb is None else int(workspace_mb * MB)
    dev = device
    if isinstance(device, str) or device is None:
        backend, _, target = (device or "cpu").partition(":")
        if backend != "npusim":
            l2, l3 = host_caches()
            cores = os.cpu_count() or 1
            role = (f"workspace {workspace_mb:g} MB" if ws else
                    f"CPU last-level cache ({l3 // MB} MB L3; L2 {l2 // MB or l2 / MB:g} MB x {cores} cores)")
            return Tiers(device or "cpu", TierSpec(FAST, ws or l3, None, role),
                         TierSpec(MID, 0, None, "none on the host"), TierSpec(SLOW, None, None, "host DRAM"))
        from ..devices import DEFAULT_DEVICE, load_device
        dev = load_device(target or DEFAULT_DEVICE)
    return Tiers(f"npusim:{dev.name}",
                 TierSpec(FAST, ws or dev.sram.size_bytes, dev.sram.bandwidth_gbps,
                          f"on-chip SRAM ({dev.sram.size_bytes // MB} MB)" + (f", workspace {workspace_mb:g} MB" if ws else "")),
                 TierSpec(MID, dev.cache.size_bytes, dev.cache.bandwidth_gbps, "DMA-fed cache"),
                 TierSpec(SLOW, None, dev.dram.bandwidth_gbps, f"DRAM ({dev.dram.kind or 'off-chip'})"),
                 burst=dev.burst_bytes, pipeline=dev.pipeline)
