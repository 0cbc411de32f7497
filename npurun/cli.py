"""The `npurun` command. Thin: parse arguments, call the library, print results.

Every NpurunError becomes one line on stderr and exit status 1 (2 for usage errors), never a
traceback; set NPURUN_DEBUG=1 to see one anyway.
"""
from __future__ import annotations

import argparse
import io
import os
import platform
import re
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from . import __version__
from .errors import InputError, NpurunError


# ---------------------------------------------------------------- helpers

@contextmanager
def _progress(description: str, enabled: bool):
    """A progress bar on a terminal (stderr), nothing when piped; yields a callback."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.console import Console
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[node]}"),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None, node="")

        def update(done, total, label):
            bar.update(task, completed=done, total=total, node=label)
        yield update


PRECISION_CHOICES = ("fp32", "auto", "fp16", "bf16", "int8", "int8_acc16", "int16")


def _add_precision(p, calibration_help: str):
    p.add_argument("--precision", default="fp32", choices=PRECISION_CHOICES,
                   help="run every node at this precision (emulated exactly; auto: the analyzer's "
                        "per-node choice; default fp32)")
    p.add_argument("--calibrate", metavar="DIR|random:N", help=calibration_help)


def _with_precision(graph, args, default_feeds):
    """The graph compiled at --precision (unchanged for fp32), calibrated on --calibrate or on
    `default_feeds()`."""
    from .compiler import with_precision
    return with_precision(graph, args.precision, args.calibrate, args.device, default_feeds)


def _executor(args):
    from .runtime import Executor
    return Executor(device=args.device, parallelism=args.threads)


def _add_device(p):
    p.add_argument("--device", default="cpu", help="BACKEND[:TARGET], e.g. cpu, reference (default: cpu)")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")


# ---------------------------------------------------------------- commands

def cmd_upscale(args) -> int:
    # One photo to one file, unless the input is a folder or a glob, there are several, or -o
    # is a folder (an existing one, or a name without a suffix): then a batch job.
    one = len(args.input) == 1 and not Path(args.input[0]).is_dir() and not set("*?[") & set(args.input[0])
    if not one or Path(args.output).is_dir() or not Path(args.output).suffix:
        return _upscale_many(args)
    from . import zoo
    from .frontend import load
    from .zoo import espcn
    from .commands.batch import check_job_flags
    check_job_flags(args)
    if args.ray:
        raise InputError("--ray runs batch jobs: give a folder, a glob or several photos, and -o OUTDIR")
    src = Path(args.input[0])
    espcn.output_format(args.output)  # fail on a bad output name before any work
    img = espcn.read_image(src)
    model_path = Path(args.model) if args.model else zoo.path("espcn_x3.onnx")
    graph = load(model_path)
    scale = espcn.model_scale(graph)
    if args.scale != scale:
        raise InputError(f"{model_path}: the model upscales by {scale}, --scale {args.scale} was asked; "
                         f"pass --scale {scale} or a model for x{args.scale}")
    # Default calibration: the bundled sample photo through the recipe (a real photo's luma).
    graph = _with_precision(graph, args, lambda: [{graph.inputs[0]: espcn.luma_to_array(
        espcn.read_image(zoo.path("sample.jpg")).convert("YCbCr").getchannel("Y"))}])
    exe = _executor(args)
    exe.compile(graph)
    t0 = time.perf_counter()
    with _progress(f"upscaling {src.name} x{scale}", not args.quiet) as cb:
        out = espcn.upscale(img, lambda y: exe.run_sync(graph, y, progress=cb)[graph.outputs[0]], scale)
    dt = time.perf_counter() - t0
    espcn.write_image(out, args.output, png_level=args.png_compression)
    prec = "" if args.precision == "fp32" else f", precision {args.precision}"
    print(f"{src} ({img.width}x{img.height}) -> {args.output} ({out.width}x{out.height}) "
          f"in {dt:.2f} s on {exe.device} ({exe.parallelism} threads{prec})")
    return 0


def _upscale_many(args) -> int:
    """`npurun upscale DIR|GLOB|FILES... -o OUTDIR`: a batch job (npurun/batch), one output per
    photo at OUTDIR/REL.FORMAT, resumable."""
    from . import zoo
    from .batch.job import Spec, plan
    from .batch.work import load_model
    from .commands import batch
    from .zoo import espcn
    batch.check_job_flags(args)
    from .batch.job import IMAGE_EXTS
    if Path(args.output).suffix.lower() in IMAGE_EXTS and not Path(args.output).is_dir():
        raise InputError(f"-o {args.output}: {', '.join(args.input)} is a batch job (a folder, a glob or several "
                         f"photos), which writes a folder of outputs; give -o a folder, and --format for their type")
    suffix = "." + args.format.lower().lstrip(".")
    espcn.output_format("x" + suffix)  # a bad --format fails before any work
    spec = Spec(kind="upscale", model=str(Path(args.model or zoo.path("espcn_x3.onnx")).resolve()),
                device=args.device, threads=args.threads_per_worker if args.ray else args.threads,
                precision=args.precision, calibrate=args.calibrate, scale=args.scale,
                png_level=args.png_compression, io_threads=args.io_threads)
    graph = load_model(spec)
    items = plan(args.input, args.output, kind="upscale", suffix=suffix)
    return batch.run(args, spec, items, graph, spec.fingerprint(suffix))


def _load_array(spec: str) -> tuple[str, np.ndarray]:
    name, sep, file = spec.partition("=")
    if not sep or not name or not file:
        raise InputError(f"--input {spec!r}: expected NAME=FILE.npy")
    try:
        return name, np.load(file, allow_pickle=False)
    except FileNotFoundError:
        raise InputError(f"--input {name}: {file}: no such file") from None
    except (ValueError, OSError, EOFError) as e:
        raise InputError(f"--input {name}: {file}: not a readable .npy file ({e})") from None


def cmd_run(args) -> int:
    from .frontend import load
    from .util import atomic_write
    graph = load(args.model)
    feeds = dict(_load_array(s) for s in args.input or [])
    graph = _with_precision(graph, args, lambda: [feeds])  # default: calibrate on these inputs
    exe = _executor(args)
    t0 = time.perf_counter()
    with _progress(f"running {Path(args.model).name}", not args.quiet) as cb:
        outs = exe.run_sync(graph, feeds, progress=cb)
    dt = time.perf_counter() - t0
    outdir = Path(args.output_dir)
    outdir.mkdir(parents=True, exist_ok=True)
    for name, arr in outs.items():
        file = outdir / (re.sub(r"[^A-Za-z0-9_.-]", "_", name) + ".npy")
        buf = io.BytesIO()
        np.save(buf, arr, allow_pickle=False)
        atomic_write(file, buf.getvalue())
        print(f"{name}: {arr.dtype} {list(arr.shape)} -> {file}")
    print(f"ran {len(graph.nodes)} nodes in {dt * 1000:.1f} ms on {exe.device}")
    return 0


def cmd_convert(args) -> int:
    from .frontend import load
    from .ir import save
    out = Path(args.output)
    if out.suffix != ".npuir":
        raise InputError(f"{out}: the output of convert must end in .npuir")
    graph = load(args.model)
    save(graph, out)
    print(f"{args.model} -> {out} ({len(graph.nodes)} nodes, {len(graph.constants())} constants)")
    return 0


def cmd_ir(args) -> int:
    from .frontend import load
    from .ir import print_graph, verify
    graph = load(args.file)
    if args.action == "print":
        sys.stdout.write(print_graph(graph))
    else:
        verify(graph)
        print(f"{args.file}: ok ({len(graph.nodes)} nodes, {len(graph.values)} values)")
    return 0


def cmd_ops_report(args) -> int:
    """For every node of the model: the backend that runs it and, where the device's own
    backend does not, why (the docstring of the rule that said no); a node the device's pass
    pipeline folded, fused or removed says so."""
    from .backends import get_backend
    from .frontend import load
    from .passes.pipeline import prepare
    graph = load(args.model)
    backend = get_backend(args.device, 1)
    lowered = prepare(graph, args.device)
    backend.compile(lowered)  # (what a run would compile: it must compile)
    by_name = {n.name: n for n in lowered.nodes if n.name}
    by_out = {o: n for n in lowered.nodes for o in n.outputs}
    rows, counts = [], {}
    for i, n in enumerate(graph.nodes):
        low = by_name.get(n.name) if n.name else by_out.get(n.outputs[0]) if n.outputs else None
        if low is not None and (low.op == n.op or low.name == n.name):
            taker, why = _taker(backend, low, lowered)
            if low.op != n.op or low.attrs.get("activation"):
                why = (f"runs as {_describe_node(low)}; " + why).rstrip("; ")
        elif n.outputs and n.outputs[-1] in by_out:
            taker, why = "-", f"fused into {by_out[n.outputs[-1]].label()}"
        elif n.outputs and all(o in lowered.values and lowered.values[o].is_const for o in n.outputs):
            taker, why = "-", "folded: computed once, before any run"
        else:
            taker, why = "-", "removed by the passes (a no-op, dead, or part of a fused node)"
        counts[taker] = counts.get(taker, 0) + 1
        rows.append((str(i), n.name or "-", n.full_op, taker, why))
    widths = [max(len(r[k]) for r in rows + [("#", "node", "op", "backend", "")]) for k in range(4)]
    print("  ".join(h.ljust(w) for h, w in zip(("#", "node", "op", "backend"), widths)) + "  why")
    for r in rows:
        print(("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4]).rstrip())
    print(f"{len(rows)} nodes on {args.device}: " + ", ".join(f"{'passes' if k == '-' else k} {v}"
                                                          for k, v in counts.items())
          + f"; {len(lowered.nodes)} after the pass pipeline")
    return 0


def _taker(backend, node, graph) -> tuple[str, str]:
    from .backends import get_backend
    ok, why = backend.supports(node, graph)
    if ok:
        return backend.name, ""
    if not backend.fallback:
        return "none", why
    ok2, why2 = get_backend(backend.fallback).supports(node, graph)
    return (backend.fallback, why) if ok2 else ("none", f"{why} {backend.fallback}: {why2}")


def _describe_node(n) -> str:
    act = n.attrs.get("activation")
    return f"{n.op} with {act} in its epilogue" if act else n.op


def cmd_info(args) -> int:
    import onnx
    from .backends import BACKENDS
    from .ir.dtypes import DTYPES
    from .ir.graph import MEMORY_SPACES
    from .ir.ops import OPS
    print(f"npurun {__version__} (Python {platform.python_version()}, NumPy {np.__version__}, "
          f"onnx {onnx.__version__}) on {platform.machine()}, {os.cpu_count()} CPUs")
    print("backends:")
    for name, cls in BACKENDS.items():
        ok, why = cls.available()
        print(f"  {name:10s} {'available' if ok else 'unavailable: ' + why}  {(cls.__doc__ or '').strip().splitlines()[0]}")
    print(f"ops: {len(OPS)}")
    print(f"dtypes: {', '.join(DTYPES)}")
    print(f"memory spaces: {', '.join(MEMORY_SPACES)}")
    return 0


# ---------------------------------------------------------------- parser

def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="npurun", description="Run neural-network models on accelerators.")
    p.add_argument("--version", action="version", version=f"npurun {__version__}")
    p.add_argument("--ops", action="append", default=[], metavar="MODULE",
                   help="import a module (name or .py file) that registers ops with npurun.register_op "
                        "before the command (repeatable; also NPURUN_OPS=a,b)")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    u = sub.add_parser("upscale", help="upscale photos with the bundled ESPCN (x3): one, or a folder as a batch job")
    u.add_argument("input", nargs="+", metavar="INPUT",
                   help="image file (PNG, JPEG, ...); or folders, globs, several files for a batch job")
    u.add_argument("-o", "--output", required=True,
                   help="output image (format from the extension); for a batch job, the output folder")
    u.add_argument("--scale", type=int, default=3, help="upscaling factor (the bundled model: 3)")
    u.add_argument("--model", help="ESPCN-style model (.onnx/.npuir) instead of the bundled one")
    u.add_argument("--format", default="png", help="batch job: the outputs' format (default: png)")
    u.add_argument("--png-compression", type=int, default=2, choices=range(10), metavar="0-9",
                   help="zlib level of PNG outputs: the same pixels at any level, 9 smallest, 2 (default) fast")
    u.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _add_device(u)
    _add_precision(u, "calibration inputs for --precision (default: the bundled sample photo)")
    from .commands.batch import add_job_flags
    add_job_flags(u)
    u.set_defaults(fn=cmd_upscale)

    r = sub.add_parser("run", help="run a model on .npy inputs")
    r.add_argument("model")
    r.add_argument("--input", action="append", metavar="NAME=FILE.npy", help="an input (repeat per input)")
    r.add_argument("--output-dir", default=".", help="where OUTPUT.npy files go (default: .)")
    r.add_argument("-q", "--quiet", action="store_true")
    _add_device(r)
    _add_precision(r, "calibration inputs for --precision (default: this run's own inputs)")
    r.set_defaults(fn=cmd_run)

    c = sub.add_parser("convert", help="convert an ONNX model to .npuir (+ .weights.npz)")
    c.add_argument("model")
    c.add_argument("-o", "--output", required=True)
    c.set_defaults(fn=cmd_convert)

    i = sub.add_parser("ir", help="print or verify a model's NPU-IR")
    i.add_argument("action", choices=["print", "verify"])
    i.add_argument("file")
    i.set_defaults(fn=cmd_ir)

    o = sub.add_parser("ops-report", help="which backend runs each node of a model, and why")
    o.add_argument("model")
    o.add_argument("--device", default="cpu")
    o.set_defaults(fn=cmd_ops_report)

    n = sub.add_parser("info", help="version, backends and why any is unavailable")
    n.set_defaults(fn=cmd_info)

    # Further commands live one per module in npurun/commands/, each with add_parser(sub).
    import importlib
    import pkgutil

    from . import commands
    for m in sorted(pkgutil.iter_modules(commands.__path__), key=lambda m: m.name):
        importlib.import_module(f"{commands.__name__}.{m.name}").add_parser(sub)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        from .registry import load_op_modules
        load_op_modules(os.environ.get("NPURUN_OPS", "").split(",") + args.ops)
        return args.fn(args)
    except NpurunError as e:
        if os.environ.get("NPURUN_DEBUG"):
            raise
        print(f"npurun: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("npurun: interrupted", file=sys.stderr)
        return 130
    except (OSError, MemoryError) as e:  # disk full, permission denied, out of memory
        if os.environ.get("NPURUN_DEBUG"):
            raise
        print(f"npurun: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
