"""A folder of 720p photos upscaled to 4K PNGs (issue O), five ways, alternating in rounds in
this process (medians; photos/s and the ratio to the pure compute rate):

    compute      the upscale alone on decoded photos held in memory (no decode, no encode, no disk)
    compute-x2   the same, two photos at once (as the pipeline computes them): the base of "of compute"
    one-by-one   decode, upscale, encode, write, one photo after the other
    pipelined    `npurun upscale DIR -o OUT`'s local job (decode and encode overlap the compute)
    ray-1/ray-2  the same job on a local Ray instance, 1 actor (all threads) / 2 actors (1 each)

    python bench/batch.py [--photos 16] [--rounds 3] [--no-ray]

Ray is started once, before the rounds; each Ray job still starts its actors and compiles the
model, so the table also gives the steady rate (first to last result on the driver) that a
long job converges to, and Ray's per-item overhead as the difference to the pipelined run's
steady time per photo. The photos: the bundled sample and scikit-image's photos, each resized
to 1280x720 (bicubic; smoother than camera photos, so PNG encoding is a little cheaper).
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image  # noqa: E402


def make_photos(folder: Path, n: int) -> list[Path]:
    from skimage import data

    from npurun import zoo
    srcs = [Image.open(zoo.path("sample.jpg")).convert("RGB")]
    srcs += [Image.fromarray(getattr(data, k)()).convert("RGB") for k in ("astronaut", "coffee", "chelsea", "rocket")]
    folder.mkdir(parents=True)
    paths = []
    for i in range(n):
        p = folder / f"photo{i:03d}.png"
        srcs[i % len(srcs)].resize((1280, 720), Image.BICUBIC).save(p)
        paths.append(p)
    return paths


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--photos", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--ways", nargs="+", help="only these (compute is always run: it is the base)")
    args = ap.parse_args()

    from npurun import zoo
    from npurun.batch.job import Spec, plan
    from npurun.batch.runner import run_job
    from npurun.batch.work import Worker
    from npurun.zoo import espcn

    tmp = Path(tempfile.mkdtemp(prefix="nb", dir="/tmp"))
    photos = make_photos(tmp / "in", args.photos)
    cores = os.cpu_count() or 1
    model = str(zoo.path("espcn_x3.onnx"))
    spec = Spec(kind="upscale", model=model, threads=cores, io_threads=2)
    worker = Worker(spec)
    decoded = [espcn.read_image(p) for p in photos]

    def compute():
        for img in decoded:
            worker.compute(None, img)
        return None

    def compute2():  # two photos computing at once, as the pipeline runs them
        from concurrent.futures import ThreadPoolExecutor
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda img: worker.compute(None, img), decoded))
        return None

    def one_by_one(out: Path):
        out.mkdir()
        for p in photos:
            img = worker.compute(None, espcn.read_image(p))
            espcn.write_image(img, out / p.name)
        return None

    def job(out: Path, ray=None, workers=None, threads=cores):
        s = Spec(kind="upscale", model=model, threads=threads, io_threads=2)
        times = []
        items = plan([str(tmp / "in")], out, kind="upscale", suffix=".png")
        summary = run_job(s, items, out, s.fingerprint(".png"), ray=ray, workers=workers, progress=False,
                          on_row=lambda r: times.append(time.perf_counter()))
        assert summary.written == len(photos) and not summary.failed, summary
        # Steady: from the first result to the last, over the items after the first arrival
        # (a Ray batch's rows reach the driver together).
        first = sum(t - times[0] < 0.01 for t in times)
        return (times[-1] - times[0]) / (len(times) - first) if len(times) > first else None

    ways = {"compute": lambda out: compute(), "compute-x2": lambda out: compute2(), "one-by-one": one_by_one,
            "pipelined": job}
    if not args.no_ray:
        from npurun.batch.ray_job import init
        t0 = time.perf_counter()
        init("local")
        print(f"(Ray started in {time.perf_counter() - t0:.1f} s)", file=sys.stderr)
        ways["ray-1"] = lambda out: job(out, ray="local", workers=1, threads=cores)
        ways["ray-2"] = lambda out: job(out, ray="local", workers=2, threads=max(1, cores // 2))
    if args.ways:
        ways = {k: v for k, v in ways.items() if k in ("compute", "compute-x2") or k in args.ways}
    total = {k: [] for k in ways}
    steady = {k: [] for k in ways}
    compute()  # warm-up: the plans, the thread pools
    for r in range(args.rounds):
        for k, fn in ways.items():
            out = tmp / f"out-{k}-{r}"
            t0 = time.perf_counter()
            st = fn(out)
            total[k].append(time.perf_counter() - t0)
            if st is not None:
                steady[k].append(st)
            shutil.rmtree(out, ignore_errors=True)
            print(f"round {r + 1} {k}: {total[k][-1]:.2f} s", file=sys.stderr)
    n = len(photos)
    # The pure compute rate: the faster of one and two photos at a time, no I/O at all.
    base = min(statistics.median(total["compute"]), statistics.median(total["compute-x2"])) / n
    print(f"# {n} photos 1280x720 -> 3840x2160 PNG, {args.rounds} rounds, medians; "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} {cores} CPUs, "
          f"Python {platform.python_version()}")
    print(f"{'way':12s} {'s/photo':>8s} {'photos/s':>9s} {'of compute':>11s} {'steady s/photo':>15s} {'steady of compute':>18s}")
    pipe_steady = statistics.median(steady["pipelined"]) if steady["pipelined"] else None
    for k in ways:
        per = statistics.median(total[k]) / n
        st = statistics.median(steady[k]) if steady[k] else None
        print(f"{k:12s} {per:8.3f} {1 / per:9.2f} {base / per:10.0%} "
              + (f"{st:15.3f} {base / st:17.0%}" if st else f"{'-':>15s} {'-':>18s}"))
    if pipe_steady and not args.no_ray:
        for k in ("ray-1",):
            st = statistics.median(steady[k])
            print(f"Ray's overhead per photo (ray-1 steady - pipelined steady): {(st - pipe_steady) * 1000:+.0f} ms "
                  f"= {(st - pipe_steady) / base:+.1%} of the compute ({base * 1000:.0f} ms)")
    worker.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
