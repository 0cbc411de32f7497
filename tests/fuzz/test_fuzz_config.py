"""Fuzz target: TOML configuration (npurun.config): a file of mutated TOML, an NPURUN_*
variable and a --set flag each holding hostile values (deep nesting, huge numbers, nan/inf,
wrong types, unknown keys, arrays and tables where scalars go, bad UTF-8). Pass: a Config
whose values all pass the schema, or a ConfigError (an NpurunError) naming file, key and
what is allowed."""
from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

import fuzzkit
from mutate import _EDIT
from mutate import apply as apply_bytes

SEED = b"""[device]
name = "cpu"
threads = 2
[scheduler]
quantum_ms = 10.0
aging_ms = 200
default_priority = 2
[thermal]
enabled = true
throttle_temp = 85
recovery_temp = 70.5
fan_curve = "quiet"
interval_s = 1.0
[qnn]
vtcm_mb = 8
"""

VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "1e999", "0x7fffffffffffffff", "9223372036854775808", "-0",
                     "true", '"x"', "[]", "{}", "[1, [2]]", "1979-05-27T07:32:00Z", '"""a"""', "'\\x'",
                     "[" * 2000 + "]" * 2000, "{a = " * 2000 + "1" + "}" * 2000, "a.b.c", "", "=", '"\\u0000"']),
    st.text(max_size=20), st.integers().map(str), st.floats().map(repr))
KEYS = st.sampled_from(["device.threads", "device.name", "scheduler.quantum_ms", "scheduler.default_priority",
                        "thermal.throttle_temp", "thermal.recovery_temp", "thermal.fan_curve", "thermal.enabled",
                        "qnn.vtcm_mb", "nope.key", "thermal.nope", "thermal", ".", "a.b.c"])


def _valid(cfg) -> None:
    """Every value the Config holds passes its key's rule (what load() promises)."""
    from npurun.config import SCHEMA
    for s, k, v, _ in cfg.items():
        key = SCHEMA[s][k]
        assert isinstance(v, key.type) and not (key.type is not bool and isinstance(v, bool)), (s, k, v)
        if key.type is float:
            assert not math.isnan(v), (s, k, v)
        if key.choices:
            assert v in key.choices, (s, k, v)
        if key.lo is not None:
            assert v >= key.lo, (s, k, v)
        if key.hi is not None:
            assert v <= key.hi, (s, k, v)
    assert cfg.get("thermal", "recovery_temp") < cfg.get("thermal", "throttle_temp")


def fuzz(n: int, stats: fuzzkit.Stats) -> None:
    from npurun import config
    tmp = Path(tempfile.mkdtemp(prefix="npurun-fuzz-config-"))
    path, none = tmp / "npurun.toml", tmp / "none"

    def one(data: bytes, env_key: str, env_val: str, flag: str, flag_val: str):
        path.write_bytes(data)
        section, _, key = env_key.partition(".")
        env = {f"NPURUN_{section.upper()}_{key.upper()}": env_val} if env_val is not None else {}
        cli = {flag: flag_val} if flag_val is not None else {}
        _valid(config.load(cli, env=env, system=path, user=none))

    files = st.one_of(st.lists(_EDIT, min_size=1, max_size=6).map(lambda e: apply_bytes(SEED, e)),
                      st.tuples(KEYS, VALUES).map(lambda kv: SEED + f"\n[{kv[0].partition('.')[0]}]\n"
                                                  f"{kv[0].partition('.')[2] or 'x'} = {kv[1]}\n".encode(errors="replace")))

    @fuzzkit.seeded
    @fuzzkit.hyp_settings(n)
    @given(files, KEYS, st.none() | st.none() | st.none() | VALUES, KEYS, st.none() | st.none() | st.none() | VALUES)
    def case(data, env_key, env_val, flag, flag_val):
        stats.case(one, data, env_key, env_val, flag, flag_val)

    case()


@pytest.mark.fuzz
def test_fuzz_toml_config():
    fuzzkit.record(fuzzkit.run_target("test_fuzz_config"))


# ---------------------------------------------------------------- what it found (fixed)

@pytest.mark.parametrize("where", ["file", "env", "flag"])
def test_deeply_nested_toml_is_a_config_error(tmp_path, where):
    """tomllib recurses on nested arrays and inline tables: 100,000 deep was a RecursionError."""
    from npurun import config
    deep = "[" * 100_000 + "]" * 100_000
    f, none = tmp_path / "c.toml", tmp_path / "none"
    f.write_text(f"[thermal]\nthrottle_temp = {deep}\n" if where == "file" else "")
    env = {"NPURUN_THERMAL_THROTTLE_TEMP": deep} if where == "env" else {}
    cli = {"thermal.throttle_temp": deep} if where == "flag" else {}
    with pytest.raises(config.ConfigError) as e:
        config.load(cli, env=env, system=f, user=none)
    where = {"file": str(f), "env": "NPURUN_THERMAL_THROTTLE_TEMP", "flag": "--set thermal.throttle_temp"}[where]
    assert "nested too deep" in str(e.value) and where in str(e.value), str(e.value)
