"""One device as the runtime sees it: its scheduler, its thermal governor and its counters,
shared by every Executor of the process that names the same device string.

    dev = Device.open("cpu", backend, units=2)   # the first opener sets the unit count
    dev.scheduler.submit(...); dev.stats()
"""
from __future__ import annotations

import threading

from .scheduler import Scheduler

_DEVICES: dict[str, "Device"] = {}
_LOCK = threading.Lock()


class Device:
    def __init__(self, name: str, units: int, backend=None, config=None):
        from .. import config as cfgmod
        cfg = config if config is not None else cfgmod.load()
        self.name = name
        self.config = cfg
        self.scheduler = Scheduler(units, quantum=cfg.get("scheduler", "quantum_ms") / 1000,
                                   aging=cfg.get("scheduler", "aging_ms") / 1000, name=name,
                                   width=slice_width(backend, units))
        self.governor = None
        if cfg.get("thermal", "enabled"):
            from .governor import Governor
            self.governor = Governor.for_device(self, backend, cfg)
            self.governor.start()

    @classmethod
    def open(cls, name: str, backend=None, units: int = 1, config=None) -> "Device":
        with _LOCK:
            dev = _DEVICES.get(name)
            if dev is None:
                dev = _DEVICES[name] = cls(name, units, backend, config)
            return dev

    @classmethod
    def all(cls) -> list["Device"]:
        with _LOCK:
            return list(_DEVICES.values())

    def stats(self) -> dict:
        """Device counters plus what the governor last read (temperature, operating point)."""
        s = self.scheduler.stats()
        g = self.governor.status() if self.governor else {}
        s["temperature_c"] = g.get("temperature_c")
        s["operating_point"] = g.get("level_name")
        s["frequency_mhz"] = g.get("frequency_mhz")
        s["cycles"] = g.get("cycles")
        s["governor"] = g
        return s

    def tasks(self) -> list[dict]:
        return self.scheduler.tasks()


def slice_width(backend, units: int) -> int:
    """Compute units one slice occupies. A backend says so with `slice_units`; the cpu
    backend's kernels spread every conv over all of its threads, so a cpu slice holds every
    unit (one lane: slices of different tasks take turns, which is what makes priorities and
    round-robin hold); otherwise a slice holds one unit."""
    w = getattr(backend, "slice_units", None)
    if w is None:
        w = getattr(backend, "parallelism", 1) if getattr(backend, "name", "") == "cpu" else 1
    return max(1, min(units, int(w)))
