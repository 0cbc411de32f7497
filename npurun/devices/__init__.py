"""Device descriptions: TOML files that tell npusim what an NPU is made of.

A device file names its compute units (MACs per cycle per precision, MAC-array tile), DVFS
operating points, memory tiers (SRAM, cache, DRAM: size and bandwidth), DMA engines, fixed
overheads, thermal RC parameters, energy per MAC and per byte, and the calibrated parameters
of the timing model. The format is documented in docs/devices.md. Files shipped with the
package live beside this module; `load_device` also takes a path to a user's own file.
Every missing or nonsensical field is an NpurunError naming the file and the key.
"""
from __future__ import annotations

import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NpurunError

HERE = Path(__file__).parent
DEFAULT_DEVICE = "x-elite-hexagon"
# Precision names in device files, and the NPU-IR precision suffixes they stand for. The IR's
# i16 is int16 activations with int8 weights (docs/precision.md), the device's w8a16.
PRECISIONS = {"int8": "i8", "int8_acc16": "i8acc16", "fp16": "f16", "int16": "i16"}
# Weight-only quantized precisions (8- or 4-bit weights, 16-bit activations): optional in a
# device file; a unit that does not list them runs them at its int16 rate.
WEIGHT_ONLY = ("w8a16", "w4a16")
IR_TO_DEVICE = {"i8": "int8", "i8acc16": "int8_acc16", "f16": "fp16", "i16": "w8a16"}
# The three families the calibration fits separately: 8-bit activations, float, 16-bit
# integer activations (int16, w8a16, w4a16 all keep activations at 16 bits).
FAMILY = {"int8": "int8", "int8_acc16": "int8", "fp16": "fp16", "int16": "a16", "w8a16": "a16", "w4a16": "a16"}
# Calibration keys and their defaults (a device file may leave any of them out).
CALIBRATION_DEFAULTS = {
    # share of peak on full tiles, per precision family (FAMILY)
    "matrix_efficiency": {"int8": 0.5, "fp16": 0.5, "a16": 0.5},
    # a product of two activations (attention's Q K^T and P V): its second operand is laid out
    # for the array at run time, not ahead of time like a weight; share of the weight rate
    "dynamic_matmul_efficiency": 1.0,
    "vector_efficiency": 0.5,      # share of the vector units' peak elementwise rate
    # a depthwise convolution's MACs on the vector units (each input reused by every tap:
    # a different rate than elementwise work, notably for ConvNeXt's 7x7 kernels)
    "depthwise_efficiency": 0.5,
    # softmax's lane ops (a max, an exp, a sum and a scale per score: VECTOR_OPS_PER_ELEMENT)
    # on the vector units: the vendor's fused kernel, not a chain of elementwise ops
    "softmax_efficiency": 0.5,
    "op_us_scale": {"int8": 1.0, "fp16": 1.0, "a16": 1.0},  # per-op overhead multiplier by family
    "graph_us_scale": {"int8": 1.0, "fp16": 1.0, "a16": 1.0},
    # a long weight stream's rate over the one [memory.dram] and [dma] imply (bus bandwidth plus
    # a setup per burst); at most the value where it reaches the bus peak (setups overlapped)
    "dram_share": 1.0,
    "io_gbps": 20.0,               # host I/O rate for the graph's inputs and outputs, GB/s
}


class DeviceError(NpurunError):
    """A device description that is missing a field or holds a nonsensical value."""


@dataclass
class ComputeUnit:
    name: str
    kind: str  # "matrix" or "vector"
    count: int
    tile: tuple[int, int, int]  # input depth, output channels, output pixels per pass
    macs_per_cycle: dict[str, float]  # device precision name -> MACs per cycle per unit


@dataclass
class DvfsPoint:
    name: str
    freq_mhz: float
    voltage_v: float
    static_power_w: float


@dataclass
class Tier:
    name: str
    size_bytes: int
    bandwidth_gbps: float  # effective GB/s (DRAM: peak x efficiency)
    kind: str = ""


@dataclass
class Device:
    name: str
    description: str
    source: str
    units: list[ComputeUnit]
    dvfs: list[DvfsPoint]
    sram: Tier
    cache: Tier
    dram: Tier
    dma_engines: int
    burst_bytes: int
    setup_cycles: float
    pipeline: int
    graph_us: float
    op_us: float
    dispatch_width: int  # independent ops dispatched at once (their overheads overlap)
    heat_capacity: float
    thermal_resistance: float
    ambient_c: float
    throttle_c: float
    recovery_c: float
    reference_voltage: float
    pj_per_mac: dict[str, float]
    pj_per_byte: dict[str, float]
    calibration: dict = field(default_factory=dict)

    def unit(self, kind: str) -> ComputeUnit:
        return next(u for u in self.units if u.kind == kind)

    @property
    def peak_tops_int8(self) -> float:
        u = self.unit("matrix")
        return 2 * u.count * u.macs_per_cycle["int8"] * self.dvfs[-1].freq_mhz * 1e6 / 1e12


class _Reader:
    """Typed access to a parsed TOML table, failing with the file and the dotted key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, msg: str):
        raise DeviceError(f"{self.source}: {key}: {msg}")

    def get(self, table: dict, key: str, where: str, kind=float, *, positive=True, allow_zero=False,
            default=None):
        full = f"{where}.{key}" if where else key
        if key not in table:
            if default is not None:
                return default
            self.fail(full, "missing")
        v = table[key]
        if kind is float:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                self.fail(full, f"expected a number, got {v!r}")
            v = float(v)
        elif kind is int:
            if isinstance(v, bool) or not isinstance(v, int):
                self.fail(full, f"expected an integer, got {v!r}")
        elif kind is str:
            if not isinstance(v, str) or not v:
                self.fail(full, f"expected a non-empty string, got {v!r}")
            return v
        elif kind is dict:
            if not isinstance(v, dict):
                self.fail(full, f"expected a table, got {v!r}")
            return v
        elif kind is list:
            if not isinstance(v, list) or not v:
                self.fail(full, f"expected a non-empty list, got {v!r}")
            return v
        if positive and (v < 0 or (v == 0 and not allow_zero)):
            self.fail(full, f"must be {'>= 0' if allow_zero else '> 0'}, got {v!r}")
        return v


def available_devices() -> list[str]:
    return sorted(p.stem for p in HERE.glob("*.toml"))


def device_path(name_or_path: str | os.PathLike) -> Path:
    p = Path(name_or_path)
    if p.suffix == ".toml" or p.exists():
        if not p.exists():
            raise DeviceError(f"{p}: no such device file")
        return p
    shipped = HERE / f"{name_or_path}.toml"
    if not shipped.exists():
        raise DeviceError(f"unknown device {str(name_or_path)!r}: shipped devices are "
                          f"{', '.join(available_devices())}, or give a path to a .toml file")
    return shipped


def load_device(name_or_path: str | os.PathLike) -> Device:
    path = device_path(name_or_path)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DeviceError(f"{path}: not valid TOML: {e}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DeviceError(f"{path}: cannot read: {e}") from None
    return parse_device(data, str(path))


def parse_device(data: dict, source: str = "<device>") -> Device:
    r = _Reader(source)
    dev = r.get(data, "device", "", dict)
    units = []
    raw_units = r.get(data, "compute_units", "", list)
    for i, u in enumerate(raw_units):
        w = f"compute_units[{i}]"
        kind = r.get(u, "kind", w, str)
        if kind not in ("matrix", "vector"):
            r.fail(f"{w}.kind", f"expected 'matrix' or 'vector', got {kind!r}")
        tile = r.get(u, "tile", w, list)
        if len(tile) != 3 or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0 for t in tile):
            r.fail(f"{w}.tile", f"expected three positive integers [depth, channels, pixels], got {tile!r}")
        mpc_t = r.get(u, "macs_per_cycle", w, dict)
        mpc = {p: r.get(mpc_t, p, f"{w}.macs_per_cycle", allow_zero=True) for p in PRECISIONS}
        for p in WEIGHT_ONLY:  # optional: a unit that does not list them runs them at its int16 rate
            mpc[p] = r.get(mpc_t, p, f"{w}.macs_per_cycle", allow_zero=True) if p in mpc_t else mpc["int16"]
        if not any(mpc.values()):
            r.fail(f"{w}.macs_per_cycle", "every precision is 0: the unit computes nothing")
        units.append(ComputeUnit(r.get(u, "name", w, str), kind, r.get(u, "count", w, int), tuple(tile), mpc))
    for kind in ("matrix", "vector"):
        if not any(u.kind == kind for u in units):
            r.fail("compute_units", f"needs one unit of kind {kind!r}")
    raw_dvfs = data.get("dvfs")
    if not isinstance(raw_dvfs, list) or not raw_dvfs:
        r.fail("dvfs", "missing: at least one DVFS operating point ([[dvfs]] table) is needed")
    dvfs = []
    for i, d in enumerate(raw_dvfs):
        w = f"dvfs[{i}]"
        dvfs.append(DvfsPoint(r.get(d, "name", w, str), r.get(d, "freq_mhz", w), r.get(d, "voltage_v", w),
                              r.get(d, "static_power_w", w, allow_zero=True)))
    if [d.freq_mhz for d in dvfs] != sorted(d.freq_mhz for d in dvfs):
        r.fail("dvfs", "operating points must be listed slowest first")
    mem = r.get(data, "memory", "", dict)
    tiers = {}
    for t in ("sram", "cache", "dram"):
        tt = r.get(mem, t, "memory", dict)
        w = f"memory.{t}"
        bw = r.get(tt, "bandwidth_gbps", w)
        if t == "dram":
            bw *= r.get(tt, "efficiency", w, default=1.0)
            if not 0 < bw:
                r.fail(f"{w}.efficiency", "must be > 0")
            size = 0
        else:
            size = int(r.get(tt, "size_mb", w, allow_zero=(t == "cache")) * 2**20)
        tiers[t] = Tier(t, size, bw, tt.get("kind", ""))
    dma = r.get(data, "dma", "", dict)
    ov = r.get(data, "overheads", "", dict)
    th = r.get(data, "thermal", "", dict)
    throttle, recovery = r.get(th, "throttle_c", "thermal"), r.get(th, "recovery_c", "thermal")
    ambient = r.get(th, "ambient_c", "thermal", positive=False)
    if not ambient < recovery < throttle:
        r.fail("thermal", f"need ambient_c < recovery_c < throttle_c, got {ambient} / {recovery} / {throttle}")
    en = r.get(data, "energy", "", dict)
    pmac_t = r.get(en, "pj_per_mac", "energy", dict)
    pbyte_t = r.get(en, "pj_per_byte", "energy", dict)
    calib = _calibration(r, data.get("calibration", {}))
    pipeline = r.get(dma, "pipeline", "dma", int)
    if pipeline < 1:
        r.fail("dma.pipeline", f"must be >= 1, got {pipeline}")
    return Device(
        name=r.get(dev, "name", "device", str), description=dev.get("description", ""), source=source,
        units=units, dvfs=dvfs, sram=tiers["sram"], cache=tiers["cache"], dram=tiers["dram"],
        dma_engines=r.get(dma, "engines", "dma", int), burst_bytes=r.get(dma, "burst_bytes", "dma", int),
        setup_cycles=r.get(dma, "setup_cycles", "dma", allow_zero=True), pipeline=pipeline,
        graph_us=r.get(ov, "graph_us", "overheads", allow_zero=True),
        op_us=r.get(ov, "op_us", "overheads", allow_zero=True),
        dispatch_width=r.get(ov, "dispatch_width", "overheads", int, default=1),
        heat_capacity=r.get(th, "heat_capacity_j_per_k", "thermal"),
        thermal_resistance=r.get(th, "resistance_k_per_w", "thermal"),
        ambient_c=ambient, throttle_c=throttle, recovery_c=recovery,
        reference_voltage=r.get(en, "reference_voltage_v", "energy"),
        pj_per_mac={**{p: r.get(pmac_t, p, "energy.pj_per_mac", allow_zero=True) for p in PRECISIONS},
                    **{p: float(pmac_t.get(p, pmac_t.get("int16", 0.0))) for p in WEIGHT_ONLY}},
        pj_per_byte={t: r.get(pbyte_t, t, "energy.pj_per_byte", allow_zero=True) for t in ("sram", "cache", "dram")},
        calibration=calib)


def _calibration(r: _Reader, table) -> dict:
    if not isinstance(table, dict):
        r.fail("calibration", "expected a table")
    out = {}
    for key, default in CALIBRATION_DEFAULTS.items():
        if isinstance(default, dict):
            sub = table.get(key, {})
            if not isinstance(sub, dict):
                r.fail(f"calibration.{key}", "expected a table")
            out[key] = {p: r.get(sub, p, f"calibration.{key}", default=d, allow_zero=True) for p, d in default.items()}
            if set(sub) - set(default):
                r.fail(f"calibration.{key}.{sorted(set(sub) - set(default))[0]}",
                       f"unknown precision family; known: {', '.join(default)}")
        else:
            out[key] = r.get(table, key, "calibration", default=default, allow_zero=True)
    unknown = set(table) - set(CALIBRATION_DEFAULTS)
    if unknown:
        r.fail(f"calibration.{sorted(unknown)[0]}", f"unknown key; known: {', '.join(CALIBRATION_DEFAULTS)}")
    return out


__all__ = ["Device", "DeviceError", "ComputeUnit", "DvfsPoint", "Tier", "load_device", "parse_device",
           "available_devices", "PRECISIONS", "IR_TO_DEVICE"]
