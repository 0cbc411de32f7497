"""Load test of `npurun serve`: 32 concurrent tritonclient clients over loopback, mixed
priorities and two models, every response checked against the reference backend.

    .venv/bin/python bench/serve_load.py                    # 32 clients, 20 s with mixed priorities
    .venv/bin/python bench/serve_load.py --clients 8 --seconds 5 --threads 2

The server is a real `npurun serve` subprocess (its own process, so its memory is measured
alone: VmRSS from /proc every half second; start, middle, end and max are printed). A warm-up
of --warmup seconds at full load comes first, so pools that fill once are full when the
memory that should stay flat is first read. Clients are threads, each with its own
tritonclient.http client, closed loop (send, wait, check, repeat): client k asks model k % 2
(ESPCN x3 on TILE x TILE tiles, or an MLP on a batch of 8) at Triton priority 1 + (k // 2) % 4, i.e. npurun priority 0..3, with tritonclient's defaults
(binary tensors both ways).

Phases, each --seconds long: `mixed` (the four priorities side by side) and `flat` (the same
clients, all at the default priority) as the baseline the priorities are read against.
Printed: requests sent / ok / wrong / failed per phase (nothing lost: sent = ok + failed, and
the server's own npurun_serve_requests_total agrees), latency percentiles per priority, and
ratios of the mixed-phase medians to the flat-phase median. Never asserted.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def make_models(d: Path, hidden: int) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    (d / "espcn_x3.onnx").write_bytes((ROOT / "npurun/zoo/espcn_x3.onnx").read_bytes())
    r = np.random.default_rng(0)
    w1 = (r.standard_normal((256, hidden)) / 16).astype(np.float32)
    w2 = (r.standard_normal((hidden, 64)) / np.sqrt(hidden)).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w2"], ["logits"]), helper.make_node("Softmax", ["logits"], ["p"], axis=-1)]
    g = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 256])],
                          [helper.make_tensor_value_info("p", TensorProto.FLOAT, ["N", 64])],
                          [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), d / "mlp.onnx")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def start_server(model_dir: Path, threads: int):
    p = subprocess.Popen([sys.executable, "-m", "npurun", "serve", str(model_dir), "--port", "0",
                          "--threads", str(threads)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"}, cwd=ROOT)
    for line in p.stdout:
        if "models ready on" in line:
            threading.Thread(target=lambda: [None for _ in p.stdout], daemon=True).start()  # drain
            return p, line.split("http://")[1].split()[0]
    raise SystemExit(f"npurun serve did not start (exit {p.wait()})")


class Workload:
    """Inputs and reference outputs per model (computed before the server starts)."""

    def __init__(self, model_dir: Path, tile: int, n: int = 4):
        import npurun
        rng = np.random.default_rng(1)
        ref = npurun.Executor("reference")
        self.cases = {}
        for name, inp, out, shape in (("espcn_x3", "input", "output", (1, 1, tile, tile)), ("mlp", "x", "p", (8, 256))):
            g = npurun.load(model_dir / f"{name}.onnx")
            xs = [(rng.random(shape, dtype=np.float32) + 0.05) for _ in range(n)]
            self.cases[name] = (inp, out, [(x, ref.run_sync(g, {inp: x})[out]) for x in xs])


def client_loop(url, model, prio, work: Workload, stop: threading.Event, rec: dict):
    import tritonclient.http as httpclient
    inp_name, out_name, cases = work.cases[model]
    c = httpclient.InferenceServerClient(url, connection_timeout=120, network_timeout=120)
    k = 0
    while not stop.is_set():
        x, want = cases[k % len(cases)]
        k += 1
        i = httpclient.InferInput(inp_name, list(x.shape), "FP32").set_data_from_numpy(x)
        rec["sent"] += 1
        t0 = time.perf_counter()
        try:
            got = c.infer(model, [i], priority=prio).as_numpy(out_name)
        except Exception as e:  # noqa: BLE001 -- counted and shown
            rec["failed"] += 1
            rec["errors"].append(str(e)[:200])
            continue
        rec["lat"].append(time.perf_counter() - t0)
        if got.shape == want.shape and np.allclose(got, want, rtol=1e-4, atol=1e-5):
            rec["ok"] += 1
        else:
            rec["wrong"] += 1
    c.close()


def scrape(url) -> dict:
    """From the server's /metrics: requests per model, and (sum, count) of the device queue
    wait per (model, npurun priority)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families
    text = urllib.request.urlopen(f"http://{url}/metrics", timeout=30).read().decode()
    out = {"requests": {}, "queue": {}}
    for f in text_string_to_metric_families(text):
        for s in f.samples:
            if s.name == "npurun_serve_requests_total":
                out["requests"][s.labels["model"]] = s.value
            elif s.name in ("npurun_serve_queue_duration_seconds_sum", "npurun_serve_queue_duration_seconds_count"):
                k = (s.labels["model"], int(s.labels["priority"]))
                sc = out["queue"].setdefault(k, [0.0, 0.0])
                sc[s.name.endswith("_count")] += s.value
    return out


def phase(url, args, work, pid, flat: bool):
    models = ["espcn_x3", "mlp"]
    plan = [(models[k % 2], 0 if flat else 1 + (k // 2) % 4) for k in range(args.clients)]
    recs = [{"sent": 0, "ok": 0, "wrong": 0, "failed": 0, "lat": [], "errors": []} for _ in plan]
    stop = threading.Event()
    before = scrape(url)
    threads = [threading.Thread(target=client_loop, args=(url, m, p, work, stop, r)) for (m, p), r in zip(plan, recs)]
    rss = [rss_mb(pid)]  # sampled every half second
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    while time.perf_counter() - t0 < args.seconds:
        time.sleep(0.5)
        rss.append(rss_mb(pid))
    stop.set()
    for t in threads:
        t.join()
    dt = time.perf_counter() - t0
    rss.append(rss_mb(pid))
    after = scrape(url)
    served = sum(after["requests"].get(m, 0) - before["requests"].get(m, 0) for m in models)
    queue = {k: ((v[0] - before["queue"].get(k, [0, 0])[0]), (v[1] - before["queue"].get(k, [0, 0])[1]))
             for k, v in after["queue"].items()}
    return plan, recs, dt, rss, served, queue


def pct(xs, q):
    return float(np.percentile(xs, q)) * 1e3 if xs else float("nan")


def report(name, plan, recs, dt, rss, served, queue):
    tot = {k: sum(r[k] for r in recs) for k in ("sent", "ok", "wrong", "failed")}
    print(f"\n{name}: {len(recs)} clients, {dt:.1f} s, {tot['sent'] / dt:.1f} req/s")
    print(f"  sent {tot['sent']}  ok {tot['ok']}  wrong {tot['wrong']}  failed {tot['failed']}  "
          f"server counted {served:.0f}  lost {tot['sent'] - tot['ok'] - tot['wrong'] - tot['failed']}")
    errs = [e for r in recs for e in r["errors"]]
    if errs:
        print(f"  first error: {errs[0]}")
    print(f"  server RSS MB: start {rss[0]:.1f}  middle {rss[len(rss) // 2]:.1f}  end {rss[-1]:.1f}  "
          f"max {max(rss):.1f}  (sampled every 0.5 s)")
    rows = {}
    for (m, p), r in zip(plan, recs):
        rows.setdefault((m, p), []).extend(r["lat"])
    print(f"  {'model':9s} {'prio':>4s} {'n':>6s} {'p50 ms':>8s} {'p90 ms':>8s} {'p99 ms':>8s}  "
          f"{'device queue, mean ms':>21s}")
    for (m, p), lat in sorted(rows.items()):
        label = "dflt" if p == 0 else f"{p - 1}"
        q = [v for (qm, qp), v in queue.items() if qm == m and (qp == p - 1 or p == 0) and v[1] > 0]
        qmean = sum(s for s, _ in q) / sum(c for _, c in q) * 1e3 if q else float("nan")
        print(f"  {m:9s} {label:>4s} {len(lat):6d} {pct(lat, 50):8.1f} {pct(lat, 90):8.1f} {pct(lat, 99):8.1f}  "
              f"{qmean:21.1f}")
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--seconds", type=float, default=20.0, help="length of each phase")
    ap.add_argument("--tile", type=int, default=96, help="ESPCN tile size")
    ap.add_argument("--hidden", type=int, default=1024, help="MLP hidden width")
    ap.add_argument("--threads", type=int, default=2, help="server compute units")
    ap.add_argument("--warmup", type=float, default=4.0, help="seconds of full load before the measured phases")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        make_models(d, args.hidden)
        work = Workload(d, args.tile)
        proc, url = start_server(d, args.threads)
        try:
            print(f"# npurun serve on {url} ({args.threads} units): ESPCN x3 {args.tile}x{args.tile} and MLP "
                  f"8x256->{args.hidden}->64, {args.clients} closed-loop clients, tritonclient binary defaults; "
                  f"priority column = npurun priority (Triton's minus 1)")
            # warm up with every client, so plans, kernels and allocator pools are in place before
            # the memory that should stay flat is first read
            phase(url, argparse.Namespace(**{**vars(args), "seconds": args.warmup}), work, proc.pid, flat=False)
            mixed = report("mixed priorities", *phase(url, args, work, proc.pid, flat=False))
            flat = report("flat (all default priority)", *phase(url, args, work, proc.pid, flat=True))
            print("\nratios, mixed-phase p50 / flat-phase p50 of the same model:")
            for m in ("espcn_x3", "mlp"):
                base = pct(flat.get((m, 0), []), 50)
                print(f"  {m:9s} " + "  ".join(f"prio {p - 1}: {pct(mixed.get((m, p), []), 50) / base:5.2f}"
                                               for p in (1, 2, 3, 4)))
        finally:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
