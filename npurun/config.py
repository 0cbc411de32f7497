"""Layered configuration in TOML. Later layers override earlier ones, key by key:

1. defaults (SCHEMA below)
2. /etc/npurun.conf                      (the system's)
3. ~/.config/npurun/config.toml          (the user's; $XDG_CONFIG_HOME is honoured)
4. the file named by $NPURUN_CONFIG
5. NPURUN_<SECTION>_<KEY> variables      (NPURUN_THERMAL_THROTTLE_TEMP=80; values read as TOML,
                                          bare words as strings)
6. command-line flags                    (`--set thermal.throttle_temp=80`, `--threads 2`)

    cfg = config.load()
    cfg.get("thermal", "throttle_temp")    # 85.0
    cfg.source("thermal", "throttle_temp") # "/etc/npurun.conf"

Every value is checked when it is read: an unknown section or key, a wrong type, a value out
of range or `recovery_temp >= throttle_temp` raises ConfigError naming the file (or variable,
or flag), the key and what is allowed.
"""
from __future__ import annotations

import os
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .errors import NpurunError

SYSTEM_FILE = Path("/etc/npurun.conf")
FAN_CURVES = ("quiet", "balanced", "aggressive")


class ConfigError(NpurunError):
    """A configuration file, variable or flag with an unknown key or a bad value."""


@dataclass(frozen=True)
class Key:
    type: type  # bool, int, float or str
    default: object
    help: str
    choices: tuple = ()
    lo: float | None = None
    hi: float | None = None

    def allowed(self) -> str:
        if self.choices:
            return "one of " + ", ".join(f'"{c}"' if isinstance(c, str) else str(c) for c in self.choices)
        what = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}[self.type]
        if self.lo is not None and self.hi is not None:
            what += f" from {self.lo:g} to {self.hi:g}"
        elif self.lo is not None:
            what += f" >= {self.lo:g}"
        return what


RECOVERY_BAND_C = 2.0  # the default recovery_temp is throttle_temp minus this (see load())

SCHEMA: dict[str, dict[str, Key]] = {
    "device": {
        "name": Key(str, "cpu", "default device, BACKEND[:TARGET]"),
        "threads": Key(int, 0, "compute units of the device; 0 = all cores", lo=0),
    },
    "scheduler": {
        "quantum_ms": Key(float, 10.0, "round-robin time slice between tasks of equal priority", lo=0.1, hi=60000),
        "aging_ms": Key(float, 200.0, "a waiting task gains one priority level per this much waiting", lo=1, hi=600000),
        "default_priority": Key(int, 2, "priority of a run that names none (0 = highest)", choices=(0, 1, 2, 3)),
    },
    "thermal": {
        "enabled": Key(bool, True, "run the thermal governor"),
        "throttle_temp": Key(float, 85.0, "above this (degrees C) step the operating point down", lo=20, hi=150),
        "recovery_temp": Key(float, 83.0, "below this (degrees C) step the operating point up "
                             "(default: throttle_temp - 2)", lo=0, hi=150),
        "fan_curve": Key(str, "aggressive", "fan duty against temperature where the device has a fan",
                         choices=FAN_CURVES),
        "interval_s": Key(float, 1.0, "seconds between two governor readings", lo=0.01, hi=3600),
        "sysfs_root": Key(str, "/sys", "where thermal zones and hwmon are read (tests point it elsewhere)"),
    },
    # Passed through to ONNX Runtime's QNN execution provider (device ort:qnn); empty / 0 = unset.
    "qnn": {
        "backend_path": Key(str, "", "QNN backend library, e.g. QnnHtp.dll"),
        "htp_performance_mode": Key(str, "", "e.g. burst, sustained_high_performance, balanced"),
        "qnn_context_priority": Key(str, "", "low, normal, normal_high or high"),
        "vtcm_mb": Key(int, 0, "VTCM (the HTP's fast memory) to reserve, MB", lo=0, hi=64),
    },
}


class Config:
    def __init__(self):
        self._values: dict[tuple[str, str], tuple[object, str]] = {
            (s, k): (key.default, "default") for s, keys in SCHEMA.items() for k, key in keys.items()}

    def get(self, section: str, key: str):
        return self._values[(section, key)][0]

    def source(self, section: str, key: str) -> str:
        return self._values[(section, key)][1]

    def items(self):
        """(section, key, value, source) for every key, in schema order."""
        for (s, k), (v, src) in self._values.items():
            yield s, k, v, src

    def as_dict(self) -> dict:
        out: dict = {}
        for s, k, v, src in self.items():
            out.setdefault(s, {})[k] = {"value": v, "source": src, "help": SCHEMA[s][k].help}
        return out

    def set(self, section: str, key: str, value, source: str):
        self._values[(section, key)] = (_check(section, key, value, source), source)


def _check(section: str, key: str, value, where: str):
    keys = SCHEMA.get(section)
    if keys is None:
        raise ConfigError(f"{where}: unknown section [{section}]; sections are "
                          + ", ".join(f"[{s}]" for s in SCHEMA))
    spec = keys.get(key)
    if spec is None:
        raise ConfigError(f"{where}: [{section}] {key}: unknown key; [{section}] takes " + ", ".join(keys))
    ok = isinstance(value, spec.type) and not (spec.type is not bool and isinstance(value, bool))
    if spec.type is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if ok and spec.choices:
        ok = value in spec.choices
    if ok and spec.lo is not None:
        ok = value >= spec.lo
    if ok and spec.hi is not None:
        ok = value <= spec.hi
    if not ok:
        raise ConfigError(f"{where}: [{section}] {key}: expected {spec.allowed()}, got {value!r}")
    return value


def _read_file(path: Path, cfg: Config, label: str | None = None):
    where = label or str(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"{where}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{where}: cannot be read ({e})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{where}: not valid TOML: {e}") from None
    except RecursionError:  # tomllib recurses on nested arrays and inline tables
        raise ConfigError(f"{where}: not valid TOML: arrays or tables nested too deep") from None
    for section, body in data.items():
        if not isinstance(body, dict):
            if section in SCHEMA:
                raise ConfigError(f"{where}: [{section}] must be a table of keys")
            _check(section, "", None, where)  # names the unknown section
        for key, value in body.items():
            cfg.set(section, key, value, where)


def _parse_scalar(raw: str, where: str):
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw  # a bare word: a string
    except RecursionError:
        raise ConfigError(f"{where}: value nested too deep to read as TOML") from None


def user_file(env=None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path(env.get("HOME") or Path.home()) / ".config")
    return Path(base) / "npurun" / "config.toml"


def load(cli: dict | None = None, *, env=None, system: Path | str | None = None,
         user: Path | str | None = None) -> Config:
    """The configuration: every layer applied in order. `cli` maps "section.key" to a value
    (already typed, or a string read as TOML) and the flag it came from, e.g.
    {"device.threads": (2, "--threads")}; a bare value is attributed to `--set section.key`."""
    env = os.environ if env is None else env
    cfg = Config()
    system = SYSTEM_FILE if system is None else Path(system)
    user = user_file(env) if user is None else Path(user)
    for path in (system, user):
        if path.is_file():
            _read_file(path, cfg)
    if env.get("NPURUN_CONFIG"):
        path = Path(env["NPURUN_CONFIG"])
        _read_file(path, cfg, f"{path} (from NPURUN_CONFIG)")
    for name in sorted(env):
        if not name.startswith("NPURUN_"):
            continue
        section, _, key = name[len("NPURUN_"):].lower().partition("_")
        if section in SCHEMA:  # other NPURUN_ variables (NPURUN_DEBUG, ...) are not config
            where = f"environment variable {name}"
            cfg.set(section, key, _parse_scalar(env[name], where), where)
    for dotted, value in (cli or {}).items():
        flag = f"--set {dotted}"
        if isinstance(value, tuple):
            value, flag = value
        section, _, key = dotted.partition(".")
        if isinstance(value, str):
            value = _parse_scalar(value, flag)
        cfg.set(section, key, value, flag)
    lo, hi = cfg.get("thermal", "recovery_temp"), cfg.get("thermal", "throttle_temp")
    if cfg.source("thermal", "recovery_temp") == "default":
        # A narrow band: throttled, the governor time-shares the two operating points around
        # the power that holds throttle_temp (one down above it, one up 2 C below), instead of
        # parking on the slower one until the die cools by a wide hysteresis. On the simulated
        # X Elite's 600 s run (bench/sched_sustained.py) 70 C gave 89% of the cool throughput,
        # 83 C gives 94% of it (the exact duty cycle's ceiling: 95%), peak still 85.0 C.
        # DVFS transitions take microseconds, so the more frequent steps cost nothing.
        lo = hi - RECOVERY_BAND_C
        cfg.set("thermal", "recovery_temp", lo, f"default (throttle_temp - {RECOVERY_BAND_C:g})")
    if lo >= hi:
        raise ConfigError(f"{cfg.source('thermal', 'recovery_temp')}: [thermal] recovery_temp = {lo:g} must be "
                          f"below throttle_temp = {hi:g} (from {cfg.source('thermal', 'throttle_temp')}); "
                          f"the gap between them is the governor's hysteresis")
    return cfg


def parse_set(items: list[str] | None) -> dict:
    """`--set SECTION.KEY=VALUE` flags to load()'s `cli` mapping."""
    out = {}
    for item in items or []:
        dotted, sep, raw = item.partition("=")
        if not sep or "." not in dotted:
            raise ConfigError(f"--set {item!r}: expected SECTION.KEY=VALUE, e.g. thermal.throttle_temp=80")
        out[dotted.strip()] = raw.strip()
    return out
