"""`npurun batch MODEL INPUTS... -o OUTDIR`: run a model over many .npy/.npz files or the rows
of Parquet tables, here or on Ray (--ray); `npurun upscale DIR|GLOB... -o OUTDIR` shares the
job flags and the runner (npurun/batch, docs/scale-out.md)."""
from __future__ import annotations

import os
import sys
from pathlib import Path


def add_job_flags(p) -> None:
    """The flags every batch job takes (`npurun batch`, and `npurun upscale` on many inputs)."""
    g = p.add_argument_group("batch jobs (several inputs, a folder or a glob)")
    g.add_argument("--io-threads", type=int, default=2, metavar="N",
                   help="decode/encode threads per worker, overlapping the compute (default: 2)")
    g.add_argument("--ray", nargs="?", const="local", metavar="ADDRESS",
                   help="run on Ray: no ADDRESS or `local` starts a local instance, `auto` or HOST:PORT "
                        "joins a cluster (needs pip install 'npurun[ray]'); put it after the inputs")
    g.add_argument("--workers", type=int, metavar="N",
                   help="with --ray: actors, each with its own copy of the model (default: CPUs / threads)")
    g.add_argument("--threads-per-worker", type=int, default=1, metavar="T",
                   help="with --ray: compute threads (and CPUs reserved) per actor (default: 1)")
    g.add_argument("--resource", metavar="NAME",
                   help="with --ray: a custom resource each actor needs one of, e.g. the accelerator "
                        "nodes' (not `NPU`, which Ray reserves for Ascend)")


def check_job_flags(args) -> None:
    from ..errors import InputError
    for flag, v in (("--io-threads", args.io_threads), ("--workers", args.workers),
                    ("--threads-per-worker", args.threads_per_worker), ("--threads", args.threads)):
        if v is not None and v < 1:
            raise InputError(f"{flag} must be at least 1, got {v}")
    if args.ray is None and (args.workers or args.resource):
        raise InputError("--workers and --resource go with --ray")
    if args.resource == "NPU":
        raise InputError("--resource NPU: Ray reserves that name for Huawei Ascend NPUs; name the resource "
                         "your accelerator nodes declare otherwise (ray start --resources='{\"hexagon\": 1}')")


def run(args, spec, items, graph, fingerprint) -> int:
    """Run the job and print its summary; exit status 1 when any item failed."""
    from ..batch.runner import run_job
    s = run_job(spec, items, args.output, fingerprint, graph=graph if args.ray is None else None,
                ray=args.ray, workers=args.workers, resource=args.resource, progress=not args.quiet)
    where = f"Ray ({args.ray})" if args.ray else f"{spec.device}, {spec.threads or os.cpu_count()} threads"
    print(f"{s.total} items -> {args.output}: {s.written} written, {s.skipped} already done, "
          f"{len(s.failed)} failed in {s.seconds:.1f} s ({s.rate:.2f} items/s on {where}); manifest {s.manifest}")
    for name, err in s.failed[:20]:
        print(f"npurun: failed: {err if name in err else f'{name}: {err}'}", file=sys.stderr)
    if len(s.failed) > 20:
        print(f"npurun: ... and {len(s.failed) - 20} more failures, listed in {s.manifest}", file=sys.stderr)
    return 1 if s.failed else 0


def add_parser(sub) -> None:
    p = sub.add_parser("batch", help="run a model over many .npy/.npz files or Parquet rows (here or on Ray)")
    p.add_argument("model", help="model (.onnx / .npuir)")
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help=".npy/.npz files, folders of them, globs, or Parquet tables (one item per row group)")
    p.add_argument("-o", "--output", required=True, metavar="OUTDIR",
                   help="output folder: NAME.npy (NAME.npz for several model outputs) per file, "
                        "NAME/part-NNNNN.parquet per row group of a table")
    p.add_argument("--column", help="Parquet: the column fed to the model (default: the only one, or the input's name)")
    p.add_argument("--input-name", help="the model input each .npy/Parquet item feeds (default: its only input)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    p.add_argument("--device", default="cpu", help="BACKEND[:TARGET] (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="compute threads here (default: all cores)")
    from ..cli import PRECISION_CHOICES
    p.add_argument("--precision", default="fp32", choices=PRECISION_CHOICES, help="as for npurun run")
    p.add_argument("--calibrate", metavar="DIR|random:N",
                   help="calibration inputs for --precision (default: random inputs)")
    add_job_flags(p)
    p.set_defaults(fn=cmd_batch)


def cmd_batch(args) -> int:
    from ..batch.job import Spec, plan
    from ..batch.work import load_model, parquet_row_groups
    check_job_flags(args)
    spec = Spec(kind="tensors", model=str(Path(args.model).resolve()), device=args.device,
                threads=args.threads_per_worker if args.ray else args.threads, precision=args.precision,
                calibrate=args.calibrate or (None if args.precision in ("fp32", "bf16") else "random:8"),
                column=args.column, input_name=args.input_name, io_threads=args.io_threads)
    graph = load_model(spec)
    suffix = ".npy" if len(graph.outputs) == 1 else ".npz"
    items = plan(args.inputs, args.output, kind="tensors", suffix=suffix, parquet_parts=parquet_row_groups)
    return run(args, spec, items, graph, spec.fingerprint(suffix))
