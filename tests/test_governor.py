"""Thermal governor and sensors, driven by a fake sysfs tree and a fake simulated device."""
import numpy as np
import pytest

from npurun.runtime.governor import CpuActuator, Governor, fan_duty
from npurun.runtime.scheduler import Scheduler
from npurun.runtime.sensors import OperatingPoint, ThermalDevice, discover


def fake_sysfs(root, zones=(45.0,), hwmon=((" coretemp", "Package id 0", 50.0),)):
    for i, t in enumerate(zones):
        z = root / "class" / "thermal" / f"thermal_zone{i}"
        z.mkdir(parents=True)
        (z / "type").write_text("x86_pkg_temp\n")
        (z / "temp").write_text(f"{int(t * 1000)}\n")
    for i, (chip, label, t) in enumerate(hwmon):
        h = root / "class" / "hwmon" / f"hwmon{i}"
        h.mkdir(parents=True)
        (h / "name").write_text(chip.strip() + "\n")
        (h / "temp1_input").write_text(f"{int(t * 1000)}\n")
        (h / "temp1_label").write_text(label + "\n")
    return root


def set_temp(root, zone, t):
    (root / "class" / "thermal" / f"thermal_zone{zone}" / "temp").write_text(f"{int(t * 1000)}\n")


class FakeNpu:
    """What npusim implements: sensors, DVFS operating points, a fan, a cycle counter."""

    def __init__(self, temp=50.0):
        self.temp = temp
        self.index = 0
        self.duty = None
        self._cycles = 0
        self.points = [OperatingPoint("1.4 GHz", 1400), OperatingPoint("1.0 GHz", 1000), OperatingPoint("0.6 GHz", 600)]
        outer = self

        class S:
            name = "npu-die"

            def read(self):
                return outer.temp
        self._sensor = S()

    def sensors(self):
        return [self._sensor]

    def operating_points(self):
        return self.points

    def operating_point(self):
        return self.index

    def set_operating_point(self, index):
        self.index = index

    def fan(self):
        return self

    def set_duty(self, percent):
        self.duty = percent

    def cycles(self):
        return self._cycles


def test_discover_reads_thermal_zones_and_hwmon_in_degrees(tmp_path):
    root = fake_sysfs(tmp_path, zones=(45.5, 61.0))
    sensors = discover(root)
    assert [s.name for s in sensors] == ["thermal_zone0:x86_pkg_temp", "thermal_zone1:x86_pkg_temp",
                                         "hwmon0:coretemp:Package id 0"]
    assert [s.read() for s in sensors] == [45.5, 61.0, 50.0]
    assert discover(tmp_path / "nothing") == []


def test_fake_device_implements_the_protocol():
    assert isinstance(FakeNpu(), ThermalDevice)


def test_dvfs_steps_down_when_hot_and_up_when_cool_with_hysteresis():
    npu = FakeNpu(50.0)
    g = Governor(npu.sensors(), npu, throttle_temp=85, recovery_temp=70)
    decisions = []
    for t in [50, 86, 90, 95, 84, 75, 71, 69, 60, 60]:
        npu.temp = t
        decisions.append((g.tick(), npu.index))
    assert decisions == [("hold", 0), ("down", 1), ("down", 2), ("hold", 2),  # lowest point: hold
                         ("hold", 2), ("hold", 2), ("hold", 2),  # between the thresholds: hold
                         ("up", 1), ("up", 0), ("hold", 0)]
    assert g.status()["frequency_mhz"] == 1400 and g.steps_down == 2 and g.steps_up == 2


def test_fan_follows_the_curve_where_the_device_has_a_fan():
    npu = FakeNpu(70.0)
    g = Governor(npu.sensors(), npu, throttle_temp=85, recovery_temp=60, fan_curve="aggressive")
    g.tick()
    assert npu.duty == 100.0
    g.fan_curve = "quiet"
    g.tick()
    assert npu.duty == pytest.approx(30.0)
    assert fan_duty("balanced", 10) == 20 and fan_duty("balanced", 200) == 100
    assert fan_duty("quiet", None) == 100  # unknown: the safe side


def test_cpu_actuator_turns_units_then_duty(tmp_path):
    root = fake_sysfs(tmp_path, zones=(90.0,), hwmon=())
    s = Scheduler(2)
    act = CpuActuator(s)
    g = Governor(discover(root), act, throttle_temp=85, recovery_temp=70)
    names = []
    for _ in range(6):
        g.tick()
        names.append((act.operating_points()[act.operating_point()].name, s.active_lanes, s.duty))
    assert names == [("1 unit", 1, 1.0), ("1 unit at 75%", 1, 0.75), ("1 unit at 50%", 1, 0.5),
                     ("1 unit at 25%", 1, 0.25), ("1 unit at 25%", 1, 0.25), ("1 unit at 25%", 1, 0.25)]
    set_temp(root, 0, 40.0)
    for _ in range(4):
        g.tick()
    assert (s.active_lanes, s.duty) == (2, 1.0)


def test_a_sensor_that_disappears_is_unknown_never_zero(tmp_path):
    root = fake_sysfs(tmp_path, zones=(90.0, 60.0), hwmon=())
    s = Scheduler(2)
    g = Governor(discover(root), CpuActuator(s), throttle_temp=85, recovery_temp=70)
    assert g.tick() == "down"
    (root / "class" / "thermal" / "thermal_zone0" / "temp").unlink()
    assert g.tick() == "up"  # the other zone (60 C) still answers
    st = g.status()
    assert st["sensors"]["thermal_zone0:x86_pkg_temp"] is None and st["temperature_c"] == 60.0
    assert st["unknown"] == ["thermal_zone0:x86_pkg_temp"]
    assert any("thermal_zone0:x86_pkg_temp is unknown" in e and "gone" in e for e in st["events"])
    (root / "class" / "thermal" / "thermal_zone1" / "temp").write_text("garbage")
    assert g.tick() == "unknown"  # no reading at all: hold, never step up, never read as 0 C
    assert g.status()["temperature_c"] is None


def test_governor_of_a_device_reads_sysfs_and_tasks_continue_when_a_sensor_vanishes(tmp_path):
    from npurun import config
    from npurun.runtime.device import Device
    root = fake_sysfs(tmp_path / "sys", zones=(95.0,), hwmon=())
    cfg = config.load(cli={"thermal.sysfs_root": str(root), "thermal.interval_s": 3600.0}, env={},
                      system=tmp_path / "none", user=tmp_path / "none")
    dev = Device("test-device", 2, backend=None, config=cfg)
    try:
        assert dev.governor.tick() == "down" and dev.scheduler.active_lanes == 1
        (root / "class" / "thermal" / "thermal_zone0" / "temp").unlink()
        assert dev.governor.tick() == "unknown"
        st = dev.stats()
        assert st["temperature_c"] is None and st["operating_point"] == "1 unit"
        from npurun.ir import parse
        from npurun.backends.base import Program
        g = parse("op relu @r (x: [4] f32 -> y: [4] f32)")
        prog = Program(g, {"relu": lambda x: np.maximum(x, 0)}, "test")
        out = dev.scheduler.submit(prog, {"x": np.array([-1, 2, -3, 4], np.float32)}).result(timeout=10)
        np.testing.assert_array_equal(out["y"], [0, 2, 0, 4])
    finally:
        dev.governor.stop()


def test_sustained_600_s_on_the_simulated_x_elite_with_the_default_config(monkeypatch):
    """Issue L's governor goal, in simulated time (deterministic: the RC model, not a clock):
    Real-ESRGAN x4 back to back for 600 s on the simulated X Elite under the default
    [thermal] settings keeps >= 90% of the cool throughput with the die at most 2 C above
    throttle_temp. With the old wide hysteresis (recovery 70 C) it kept 89%."""
    import os

    from npurun import config
    from npurun.backends.npusim.simulate import estimate
    from npurun.backends.npusim.thermal import SimulatedNpu, run_sustained
    from npurun.devices import load_device
    from npurun.runtime.governor import npusim_governor
    from npurun.zoo.architectures import build
    for k in [k for k in os.environ if k.startswith("NPURUN_")]:
        monkeypatch.delenv(k)
    dev = load_device("x-elite-hexagon")
    g = build("real_esrgan_x4plus")
    shape = {i: g.values[i].shape for i in g.inputs}
    per_point = [(r.latency_s, r.energy_j) for r in (estimate(g, dev, shape, dvfs_index=i) for i in range(len(dev.dvfs)))]
    cfg = config.load()
    results = {}
    for recovery in (None, 70.0):
        npu = SimulatedNpu(dev)
        kw = {} if recovery is None else {"recovery_temp": recovery}
        gov = npusim_governor(npu, cfg, **kw)
        res = run_sustained(dev, per_point, 600.0, governor=gov, npu=npu)
        results[recovery] = (res.throughput * per_point[-1][0], res.peak_temp_c)
    share, peak = results[None]
    assert share >= 0.90 and peak <= cfg.get("thermal", "throttle_temp") + 2, results
    assert results[70.0][0] < share  # the narrow band is what gained it
