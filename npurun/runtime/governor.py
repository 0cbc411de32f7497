"""The thermal governor: reads temperatures, steps the operating point down when hot and up
when cool again, and sets the fan where the device has one.

Policy, once per `interval` (one `tick()`):
- the temperature is the hottest of the sensors that answered; sensors that did not are
  listed as unknown (a sensor that disappears is reported once, as an event);
- above `throttle_temp`: one operating point down (slower, cooler);
- below `recovery_temp`: one operating point up;
- in between: hold (the gap is the hysteresis, so the point does not flap);
- every sensor unknown: hold, never step up (cool cannot be proved), and say so in status;
- fan: duty from `fan_curve` (quiet, balanced, aggressive) against the temperature.

Actuators: a `ThermalDevice` (see sensors.py) brings its own operating points (DVFS on the
simulator); on a host CPU, `CpuActuator` turns the scheduler's knobs: compute units in use,
then duty cycling of the last unit.
"""
from __future__ import annotations

import threading
import time
from pathlib import Path

from .sensors import OperatingPoint, discover, nvml_sensors

# Fan duty (percent) against temperature (degrees C), interpolated between the points.
FAN_CURVES = {
    "quiet": [(40, 0), (70, 30), (85, 60), (95, 100)],
    "balanced": [(35, 20), (60, 40), (80, 80), (90, 100)],
    "aggressive": [(30, 40), (50, 60), (70, 100)],
}


def fan_duty(curve: str, temp: float | None) -> float:
    """Fan duty for `temp` on `curve`; unknown temperature: full speed (the safe side)."""
    pts = FAN_CURVES[curve]
    if temp is None:
        return 100.0
    if temp <= pts[0][0]:
        return float(pts[0][1])
    for (t0, d0), (t1, d1) in zip(pts, pts[1:]):
        if temp <= t1:
            return d0 + (d1 - d0) * (temp - t0) / (t1 - t0)
    return float(pts[-1][1])


class CpuActuator:
    """Operating points of a host CPU as the scheduler's knobs: all lanes, fewer lanes, then
    the last lane duty-cycled (75%, 50%, 25%). Frequency is the OS's business (no DVFS).
    On the cpu backend one lane is every thread (a slice's kernels use them all), so only
    duty cycling is left to turn there."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        w = scheduler.width  # units per lane: fewer units means fewer lanes
        self._points = [OperatingPoint(f"{k * w} unit{'s' * (k * w > 1)}", units=k * w)
                        for k in range(scheduler.lanes, 0, -1)]
        self._points += [OperatingPoint(f"{w} unit{'s' * (w > 1)} at {int(d * 100)}%", units=w, duty=d)
                         for d in (0.75, 0.5, 0.25)]
        self._index = 0

    def sensors(self):
        return []

    def operating_points(self):
        return self._points

    def operating_point(self) -> int:
        return self._index

    def set_operating_point(self, index: int) -> None:
        self._index = index
        p = self._points[index]
        self.scheduler.set_operating(active_units=p.units, duty=p.duty)

    def fan(self):
        return None

    def cycles(self):
        return None


class Governor:
    def __init__(self, sensors, actuator, *, throttle_temp=85.0, recovery_temp=70.0,
                 fan_curve="aggressive", interval=1.0, clock=time.monotonic):
        if recovery_temp >= throttle_temp:
            from ..config import ConfigError
            raise ConfigError(f"recovery_temp {recovery_temp:g} must be below throttle_temp {throttle_temp:g}")
        self.sensors = list(sensors)
        self.actuator = actuator
        self.throttle_temp, self.recovery_temp = throttle_temp, recovery_temp
        self.fan_curve, self.interval, self.clock = fan_curve, interval, clock
        self.temperature: float | None = None
        self.readings: dict[str, float | None] = {}
        self.fan_percent: float | None = None
        self.events: list[tuple[float, str]] = []
        self.steps_down = self.steps_up = 0
        self._missing: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @classmethod
    def for_device(cls, device, backend, cfg) -> "Governor":
        """The governor of a runtime Device: the backend's own ThermalDevice if it has one,
        else the host's sysfs sensors (plus NVML for CUDA devices) driving the CPU knobs."""
        td = getattr(backend, "thermal_device", None)
        td = td() if callable(td) else None
        if td is not None:
            sensors, actuator = list(td.sensors()), td
        else:
            sensors = discover(Path(cfg.get("thermal", "sysfs_root")))
            if "cuda" in device.name:
                sensors += nvml_sensors()
            actuator = CpuActuator(device.scheduler)
        return cls(sensors, actuator, throttle_temp=cfg.get("thermal", "throttle_temp"),
                   recovery_temp=cfg.get("thermal", "recovery_temp"),
                   fan_curve=cfg.get("thermal", "fan_curve"), interval=cfg.get("thermal", "interval_s"))

    # ------------------------------------------------------------------ policy
    def tick(self) -> str:
        """Read, decide, act once; returns 'down', 'up', 'hold' or 'unknown'."""
        with self._lock:
            readings = {}
            for s in self.sensors:
                try:
                    readings[s.name] = s.read()
                except Exception:  # a sensor must never stop the governor  # noqa: BLE001
                    readings[s.name] = None
            for name, v in readings.items():
                if v is None and name not in self._missing:
                    self._missing.add(name)
                    why = next((getattr(s, "last_error", "") for s in self.sensors if s.name == name), "")
                    self._event(f"sensor {name} is unknown" + (f" ({why})" if why else ""))
                elif v is not None and name in self._missing:
                    self._missing.discard(name)
                    self._event(f"sensor {name} is back: {v:.1f} C")
            self.readings = readings
            known = [v for v in readings.values() if v is not None]
            self.temperature = max(known) if known else None
            points = self.actuator.operating_points()
            cur = self.actuator.operating_point()
            if self.temperature is None:
                decision = "unknown"
            elif self.temperature > self.throttle_temp and cur < len(points) - 1:
                decision = "down"
                self.actuator.set_operating_point(cur + 1)
                self.steps_down += 1
                self._event(f"{self.temperature:.1f} C > {self.throttle_temp:g} C: {points[cur].name} -> {points[cur + 1].name}")
            elif self.temperature < self.recovery_temp and cur > 0:
                decision = "up"
                self.actuator.set_operating_point(cur - 1)
                self.steps_up += 1
                self._event(f"{self.temperature:.1f} C < {self.recovery_temp:g} C: {points[cur].name} -> {points[cur - 1].name}")
            else:
                decision = "hold"
            fan = self.actuator.fan()
            if fan is not None:
                self.fan_percent = fan_duty(self.fan_curve, self.temperature)
                fan.set_duty(self.fan_percent)
            return decision

    def _event(self, msg: str):
        self.events.append((self.clock(), msg))
        del self.events[:-50]

    def status(self) -> dict:
        points = self.actuator.operating_points()
        cur = self.actuator.operating_point()
        p = points[cur] if points else None
        return {"temperature_c": self.temperature, "sensors": dict(self.readings),
                "unknown": sorted(self._missing), "level": cur, "levels": len(points),
                "level_name": p.name if p else None, "frequency_mhz": p.frequency_mhz if p else None,
                "fan_percent": self.fan_percent, "cycles": self.actuator.cycles(),
                "throttle_temp": self.throttle_temp, "recovery_temp": self.recovery_temp,
                "steps_down": self.steps_down, "steps_up": self.steps_up,
                "events": [m for _, m in self.events[-5:]]}

    # ------------------------------------------------------------------ thread
    def start(self):
        """Tick every `interval` seconds in a daemon thread (not when there is no sensor)."""
        if not self.sensors or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._loop, name="npurun-governor", daemon=True)
        self._thread.start()

    def _loop(self):
        while not self._stop.wait(self.interval):
            self.tick()

    def stop(self):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None


class SimulatedNpuThermal:
    """The ThermalDevice view of npusim's `SimulatedNpu` (temperature_c(), dvfs_points listed
    slowest first, dvfs_index, set_dvfs(i)): operating points fastest first, as the governor
    counts them."""

    def __init__(self, npu):
        self.npu = npu
        outer = self

        class _Die:
            name = "npusim-die"

            def read(self):
                return outer.npu.temperature_c()
        self._sensor = _Die()

    def sensors(self):
        return [self._sensor]

    def operating_points(self):
        return [OperatingPoint(p.name, p.freq_mhz) for p in reversed(self.npu.dvfs_points)]

    def operating_point(self) -> int:
        return len(self.npu.dvfs_points) - 1 - self.npu.dvfs_index

    def set_operating_point(self, index: int) -> None:
        self.npu.set_dvfs(len(self.npu.dvfs_points) - 1 - index)

    def fan(self):
        return None

    def cycles(self):
        return None


def npusim_governor(npu, cfg=None, **kw) -> "Governor":
    """A Governor over a SimulatedNpu with `decide(npu) -> dvfs index`, the interface npusim's
    run_sustained() drives: one tick per control period of simulated time."""
    if cfg is not None:
        kw = {"throttle_temp": cfg.get("thermal", "throttle_temp"), "recovery_temp": cfg.get("thermal", "recovery_temp"),
              "fan_curve": cfg.get("thermal", "fan_curve"), **kw}
    dev = SimulatedNpuThermal(npu)
    gov = Governor(dev.sensors(), dev, **kw)

    def decide(n):
        dev.npu = n
        gov.tick()
        return n.dvfs_index
    gov.decide = decide
    return gov
