"""Sustained run with the thermal governor on the npusim simulator (issue F).

    .venv/bin/python bench/sched_sustained.py [--device x-elite-hexagon] [--seconds 600]

npusim models the die temperature (an RC model) and DVFS in simulated time; this drives its
`run_sustained` with npurun's Governor (runtime/governor.py) instead of npusim's own step
governor, on a workload whose per-point (latency, energy) comes from npusim's estimate of
ESPCN x3 on 256x256 tiles. It prints peak and final temperature, time at each operating
point and the sustained throughput against the cool one. Reported, not asserted.

What is still missing for the full issue-F run: npusim's backend does not yet expose a
`thermal_device()` for the live Executor path (tasks running through the scheduler while the
governor ticks in wall time), so this run is in simulated time through run_sustained().
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="x-elite-hexagon")
    ap.add_argument("--seconds", type=float, default=600.0)
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--model", help="model file, or a calibration architecture name (real_esrgan_x4plus), instead of ESPCN")
    ap.add_argument("--shape", help="INPUT=DxDx.. for --model")
    args = ap.parse_args()
    try:
        from npurun.backends.npusim.simulate import estimate
        from npurun.backends.npusim.thermal import SimulatedNpu, run_sustained
        from npurun.devices import load_device
    except ImportError as e:
        sys.exit(f"sched_sustained: the npusim simulator is not available yet ({e})")
    import npurun
    from npurun import config
    from npurun.runtime.governor import npusim_governor
    dev = load_device(args.device)
    if args.model and not Path(args.model).exists():  # a calibration architecture's name
        from npurun.zoo.architectures import build
        g = build(args.model)
        shape = {i: g.values[i].shape for i in g.inputs}
    else:
        g = npurun.load(args.model or ROOT / "npurun" / "zoo" / "espcn_x3.onnx")
        shape = {"input": (1, 1, args.tile, args.tile)}
    if args.shape:
        from npurun.commands.profile import parse_shapes
        shape = parse_shapes([args.shape])
    per_point = []
    for i in range(len(dev.dvfs)):
        rep = estimate(g, dev, shape, dvfs_index=i)
        per_point.append((rep.latency_s if hasattr(rep, "latency_s") else rep.to_dict()["latency_s"],
                          rep.energy_j if hasattr(rep, "energy_j") else rep.to_dict()["energy_j"]))
    cfg = config.load()
    npu = SimulatedNpu(dev)
    gov = npusim_governor(npu, cfg)
    res = run_sustained(dev, per_point, args.seconds, governor=gov, npu=npu)
    print(f"# {args.device}: {g.name} {shape} back to back for {args.seconds:g} s (simulated), "
          f"governor throttle {gov.throttle_temp:g} C / recovery {gov.recovery_temp:g} C")
    print(f"peak {res.peak_temp_c:.1f} C, final {res.final_temp_c:.1f} C, steps down {gov.steps_down}, up {gov.steps_up}")
    for name, t in sorted(res.time_at_point.items(), key=lambda kv: -kv[1]):
        print(f"  {name:12s} {t:8.1f} s ({t / args.seconds:.0%})")
    print(f"sustained {res.throughput:.1f}/s vs cool {1 / per_point[-1][0]:.1f}/s "
          f"({res.throughput * per_point[-1][0]:.0%})")
    ideal = ideal_throughput(dev, per_point, args.seconds, gov.throttle_temp)
    print(f"ideal {ideal:.1f}/s ({ideal * per_point[-1][0]:.0%}): full speed until {gov.throttle_temp:g} C, then the "
          f"two operating points around the power that holds it there, time-shared exactly")


def ideal_throughput(dev, per_point, seconds, throttle):
    """The ceiling of any governor on this RC model: the fastest point until the die reaches
    `throttle`, then a duty cycle of the two adjacent points whose mean power holds it there."""
    import math
    rc = dev.thermal_resistance * dev.heat_capacity
    rate = [1 / lat for lat, _ in per_point]
    power = [e / lat for lat, e in per_point]
    t_inf = dev.ambient_c + power[-1] * dev.thermal_resistance
    if t_inf <= throttle:
        return rate[-1]
    t1 = min(seconds, -rc * math.log((t_inf - throttle) / (t_inf - dev.ambient_c)))
    hold = (throttle - dev.ambient_c) / dev.thermal_resistance  # the power that holds `throttle`
    held = rate[0]
    for (pa, ra), (pb, rb) in zip(zip(power[1:], rate[1:]), zip(power, rate)):  # (faster, slower) pairs
        if pb <= hold <= pa:
            d = (hold - pb) / (pa - pb)
            held = d * ra + (1 - d) * rb
    return (t1 * rate[-1] + (seconds - t1) * held) / seconds


if __name__ == "__main__":
    main()
