"""Thermal RC model, the DVFS knob and the sensor: the small interface a governor drives.

The die is one lumped node: C dT/dt = P - (T - T_ambient) / R. Over an interval at constant
power the exact solution is T(t+dt) = T_inf + (T - T_inf) exp(-dt / (R C)), T_inf = T_amb + P R,
so integration is exact per step whatever the step.

`SimulatedNpu` is what a governor sees: `temperature_c()` (the sensor), `dvfs_points`,
`dvfs_index` / `set_dvfs(i)` (the knob). `StepGovernor` is the simple policy npusim ships:
one step down above throttle_c, one step up below recovery_c. The general governor (issue F)
can drive the same interface: any object with `decide(npu) -> int` is a governor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ...devices import Device


class SimulatedNpu:
    def __init__(self, dev: Device, dvfs_index: int | None = None, temperature_c: float | None = None):
        self.dev = dev
        self.dvfs_points = dev.dvfs
        self.dvfs_index = len(dev.dvfs) - 1 if dvfs_index is None else dvfs_index
        self.temp = dev.ambient_c if temperature_c is None else temperature_c
        self.time_s = 0.0

    # --- sensor and knob
    def temperature_c(self) -> float:
        return self.temp

    def set_dvfs(self, index: int) -> None:
        self.dvfs_index = max(0, min(len(self.dvfs_points) - 1, int(index)))

    @property
    def dvfs(self):
        return self.dvfs_points[self.dvfs_index]

    # --- the RC model
    def advance(self, power_w: float, dt: float) -> float:
        """Hold `power_w` for `dt` seconds; return the new temperature."""
        d = self.dev
        t_inf = d.ambient_c + power_w * d.thermal_resistance
        self.temp = t_inf + (self.temp - t_inf) * math.exp(-dt / (d.thermal_resistance * d.heat_capacity))
        self.time_s += dt
        return self.temp


@dataclass
class StepGovernor:
    throttle_c: float
    recovery_c: float

    def decide(self, npu: SimulatedNpu) -> int:
        t = npu.temperature_c()
        if t > self.throttle_c:
            return npu.dvfs_index - 1
        if t < self.recovery_c:
            return npu.dvfs_index + 1
        return npu.dvfs_index


@dataclass
class SustainedResult:
    seconds: float
    inferences: float
    peak_temp_c: float
    final_temp_c: float
    samples: list = field(default_factory=list)  # (t, temp_c, freq_mhz, power_w)
    time_at_point: dict = field(default_factory=dict)

    @property
    def throughput(self) -> float:
        return self.inferences / self.seconds if self.seconds else 0.0


def run_sustained(dev: Device, per_point: list[tuple[float, float]], seconds: float, governor=None,
                  period_s: float = 0.1, npu: SimulatedNpu | None = None) -> SustainedResult:
    """Back-to-back inferences for `seconds` of simulated time. `per_point[i]` is (latency s,
    energy J) of one inference at DVFS point i. Each control period the NPU runs whole and
    partial inferences at the current point (power = energy / latency), the RC model advances,
    and the governor picks the next point."""
    npu = npu or SimulatedNpu(dev)
    gov = governor or StepGovernor(dev.throttle_c, dev.recovery_c)
    res = SustainedResult(seconds, 0.0, npu.temp, npu.temp)
    t = 0.0
    while t < seconds - 1e-12:
        dt = min(period_s, seconds - t)
        lat, energy = per_point[npu.dvfs_index]
        power = energy / lat
        res.inferences += dt / lat
        name = npu.dvfs.name
        res.time_at_point[name] = res.time_at_point.get(name, 0.0) + dt
        res.samples.append((t, npu.temp, npu.dvfs.freq_mhz, power))
        npu.advance(power, dt)
        t += dt
        res.peak_temp_c = max(res.peak_temp_c, npu.temp)
        npu.set_dvfs(gov.decide(npu))
    res.final_temp_c = npu.temp
    res.samples.append((t, npu.temp, npu.dvfs.freq_mhz, per_point[npu.dvfs_index][1] / per_point[npu.dvfs_index][0]))
    return res
