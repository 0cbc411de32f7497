"""Temperature sensors, and the small protocol a device implements for the thermal governor.

A sensor's `read()` returns degrees Celsius, or None when the reading is unknown (file gone,
unreadable, driver error). Unknown is never 0 degrees C.

Sources:
- Linux thermal zones: /sys/class/thermal/thermal_zone*/temp (millidegrees), `type` names it.
- Linux hwmon: /sys/class/hwmon/hwmon*/temp*_input (millidegrees), `name` and `temp*_label`.
- NVML on NVIDIA GPUs (package nvidia-ml-py, optional, imported only when asked for).
- A simulated device (npusim) through `ThermalDevice` below.

The `ThermalDevice` protocol is what a backend with its own thermal model implements (the
npusim simulator, a real NPU driver); the governor reads its sensors and turns its knobs:

    class ThermalDevice(Protocol):
        def sensors(self) -> list[Sensor]
        def operating_points(self) -> list[OperatingPoint]   # fastest first
        def operating_point(self) -> int                      # index into operating_points()
        def set_operating_point(self, index: int) -> None     # DVFS
        def fan(self) -> Fan | None                           # None: no fan
        def cycles(self) -> int | None                        # cycles so far, None if not counted

A backend offers one by a method `thermal_device()` returning it (or None).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable


@runtime_checkable
class Sensor(Protocol):
    name: str

    def read(self) -> float | None: ...


@runtime_checkable
class Fan(Protocol):
    def set_duty(self, percent: float) -> None: ...


@dataclass(frozen=True)
class OperatingPoint:
    name: str
    frequency_mhz: float | None = None
    units: int | None = None  # compute units in use
    duty: float = 1.0  # fraction of time the units may work


@runtime_checkable
class ThermalDevice(Protocol):
    def sensors(self) -> list: ...

    def operating_points(self) -> list: ...

    def operating_point(self) -> int: ...

    def set_operating_point(self, index: int) -> None: ...

    def fan(self): ...

    def cycles(self) -> int | None: ...


class MilliCelsiusFile:
    """A sysfs file holding millidegrees Celsius (thermal zones and hwmon both do)."""

    def __init__(self, path: Path, name: str):
        self.path, self.name = Path(path), name
        self.last_error = ""

    def read(self) -> float | None:
        try:
            raw = self.path.read_text().strip()
            self.last_error = ""
            return int(raw) / 1000.0
        except FileNotFoundError:
            self.last_error = f"{self.path}: gone"
        except (OSError, ValueError) as e:
            self.last_error = f"{self.path}: {e.__class__.__name__}: {e}"
        return None

    def __repr__(self):
        return f"MilliCelsiusFile({str(self.path)!r}, {self.name!r})"


def _text(path: Path, default: str) -> str:
    try:
        return path.read_text().strip() or default
    except OSError:
        return default


def thermal_zones(root: Path | str = "/sys") -> list[MilliCelsiusFile]:
    base = Path(root) / "class" / "thermal"
    out = []
    for zone in sorted(base.glob("thermal_zone*")):
        if (zone / "temp").exists():
            out.append(MilliCelsiusFile(zone / "temp", f"{zone.name}:{_text(zone / 'type', 'zone')}"))
    return out


def hwmon(root: Path | str = "/sys") -> list[MilliCelsiusFile]:
    base = Path(root) / "class" / "hwmon"
    out = []
    for mon in sorted(base.glob("hwmon*")):
        chip = _text(mon / "name", mon.name)
        for inp in sorted(mon.glob("temp*_input")):
            label = _text(mon / inp.name.replace("_input", "_label"), inp.name.replace("_input", ""))
            out.append(MilliCelsiusFile(inp, f"{mon.name}:{chip}:{label}"))
    return out


def discover(root: Path | str = "/sys") -> list[MilliCelsiusFile]:
    """Every thermal zone and hwmon temperature under `root` (the host's sensors)."""
    return thermal_zones(root) + hwmon(root)


class NvmlSensor:
    """GPU core temperature through NVML (nvidia-ml-py, imported only here)."""

    def __init__(self, index: int = 0):
        try:
            import pynvml
        except ImportError as e:
            from ..errors import BackendError
            raise BackendError("NVML temperatures need the nvidia-ml-py package "
                               "(pip install nvidia-ml-py)") from e
        self._nv = pynvml
        pynvml.nvmlInit()
        self._h = pynvml.nvmlDeviceGetHandleByIndex(index)
        name = pynvml.nvmlDeviceGetName(self._h)
        self.name = f"nvml{index}:{name.decode() if isinstance(name, bytes) else name}"
        self.last_error = ""

    def read(self) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetTemperature(self._h, self._nv.NVML_TEMPERATURE_GPU))
        except Exception as e:  # NVMLError subclasses: GPU lost, driver reloaded ...  # noqa: BLE001
            self.last_error = f"{self.name}: {e}"
            return None

    def frequency_mhz(self) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetClockInfo(self._h, self._nv.NVML_CLOCK_SM))
        except Exception:  # noqa: BLE001
            return None

    def fan_percent(self) -> float | None:
        try:
            return float(self._nv.nvmlDeviceGetFanSpeed(self._h))
        except Exception:  # no fan (passively cooled boards) or not permitted  # noqa: BLE001
            return None


def nvml_sensors() -> list[NvmlSensor]:
    """One sensor per NVIDIA GPU, or [] where nvidia-ml-py or the driver is missing."""
    try:
        import pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # not installed, no driver, no GPU  # noqa: BLE001
        return []
    return [NvmlSensor(i) for i in range(count)]
