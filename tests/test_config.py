"""Layered TOML configuration and `npurun config show`."""
import json

import pytest

from npurun import config
from npurun.cli import main
from npurun.config import ConfigError


@pytest.fixture
def layers(tmp_path):
    sysf, user, extra = tmp_path / "npurun.conf", tmp_path / "user.toml", tmp_path / "extra.toml"
    sysf.write_text('[thermal]\nthrottle_temp = 85\nrecovery_temp = 70\nfan_curve = "aggressive"\n')
    user.write_text('[thermal]\nfan_curve = "quiet"\n[scheduler]\nquantum_ms = 5\n')
    extra.write_text('[scheduler]\naging_ms = 50\n')
    return sysf, user, extra


def test_layers_apply_in_order_and_say_where_each_value_came_from(layers):
    sysf, user, extra = layers
    env = {"NPURUN_CONFIG": str(extra), "NPURUN_THERMAL_THROTTLE_TEMP": "90", "NPURUN_DEBUG": "1",
           "NPURUN_MODEL_CACHE": "/x", "NPURUN_SCHEDULER_QUANTUM_MS": "7.5"}
    cfg = config.load({"scheduler.quantum_ms": "3", "device.threads": (2, "--threads")},
                      env=env, system=sysf, user=user)
    assert cfg.get("thermal", "throttle_temp") == 90.0
    assert cfg.source("thermal", "throttle_temp") == "environment variable NPURUN_THERMAL_THROTTLE_TEMP"
    assert (cfg.get("thermal", "recovery_temp"), cfg.source("thermal", "recovery_temp")) == (70.0, str(sysf))
    assert (cfg.get("thermal", "fan_curve"), cfg.source("thermal", "fan_curve")) == ("quiet", str(user))
    assert cfg.source("scheduler", "aging_ms") == f"{extra} (from NPURUN_CONFIG)"
    assert (cfg.get("scheduler", "quantum_ms"), cfg.source("scheduler", "quantum_ms")) == (3.0, "--set scheduler.quantum_ms")
    assert (cfg.get("device", "threads"), cfg.source("device", "threads")) == (2, "--threads")
    assert cfg.source("device", "name") == "default"


@pytest.mark.parametrize("text, words", [
    ("[thermal]\nthrotle_temp = 80\n", "[thermal] throtle_temp: unknown key; [thermal] takes enabled, throttle_temp"),
    ("[thermals]\nx = 1\n", "unknown section [thermals]; sections are [device], [scheduler], [thermal]"),
    ('[thermal]\nthrottle_temp = "hot"\n', "[thermal] throttle_temp: expected a number from 20 to 150, got 'hot'"),
    ('[thermal]\nfan_curve = "loud"\n', '[thermal] fan_curve: expected one of "quiet", "balanced", "aggressive", got \'loud\''),
    ("[thermal]\nenabled = 1\n", "[thermal] enabled: expected true or false, got 1"),
    ("[scheduler]\ndefault_priority = 5\n", "[scheduler] default_priority: expected one of 0, 1, 2, 3, got 5"),
    ("[thermal]\nrecovery_temp = 90\n", "[thermal] recovery_temp = 90 must be below throttle_temp = 85"),
    ("[thermal\n", "not valid TOML"),
])
def test_bad_files_name_the_file_the_key_and_what_is_allowed(tmp_path, text, words):
    f = tmp_path / "bad.toml"
    f.write_text(text)
    with pytest.raises(ConfigError) as e:
        config.load(env={}, system=f, user=tmp_path / "none")
    assert str(f) in str(e.value) and words in str(e.value)


def test_bad_environment_variable_and_flag_are_named(tmp_path):
    none = tmp_path / "none"
    with pytest.raises(ConfigError, match="environment variable NPURUN_THERMAL_FANCURVE: .thermal. fancurve: unknown key"):
        config.load(env={"NPURUN_THERMAL_FANCURVE": "quiet"}, system=none, user=none)
    with pytest.raises(ConfigError, match=r"--set device.threads: \[device\] threads: expected an integer >= 0, got -2"):
        config.load({"device.threads": "-2"}, env={}, system=none, user=none)
    with pytest.raises(ConfigError, match="NPURUN_CONFIG.*no such file"):
        config.load(env={"NPURUN_CONFIG": str(none)}, system=none, user=none)
    with pytest.raises(ConfigError, match="expected SECTION.KEY=VALUE"):
        config.parse_set(["threads2"])


def test_user_file_honours_xdg(tmp_path):
    assert config.user_file({"XDG_CONFIG_HOME": str(tmp_path)}) == tmp_path / "npurun" / "config.toml"
    assert config.user_file({"HOME": str(tmp_path)}) == tmp_path / ".config" / "npurun" / "config.toml"


def test_config_show_prints_values_and_sources(tmp_path, monkeypatch, capsys):
    f = tmp_path / "c.toml"
    f.write_text("[thermal]\nthrottle_temp = 80\n")
    monkeypatch.setenv("NPURUN_CONFIG", str(f))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("NPURUN_SCHEDULER_AGING_MS", "150")
    assert main(["config", "show", "--json", "--set", "device.name=reference"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["thermal"]["throttle_temp"] == {"value": 80.0, "source": f"{f} (from NPURUN_CONFIG)",
                                                "help": config.SCHEMA["thermal"]["throttle_temp"].help}
    assert data["scheduler"]["aging_ms"]["source"] == "environment variable NPURUN_SCHEDULER_AGING_MS"
    assert data["device"]["name"]["value"] == "reference"
    assert main(["config", "show"]) == 0
    out = capsys.readouterr().out
    assert "[thermal]" in out and "throttle_temp = 80.0" in out and "NPURUN_CONFIG" in out
    f.write_text("[thermal]\nrecovery_temp = 99\n")
    assert main(["config", "show"]) == 1
    assert "recovery_temp = 99 must be below throttle_temp" in capsys.readouterr().err
