"""`npurun compile MODEL -o OUT.npuir`: standard passes, calibration and precision selection,
written as an .npuir whose nodes carry their precision (`conv_i8`) and reason (`why="..."`)
and whose values carry their calibrated ranges (`range` statements). `--explain` prints the
per-node plan; `--memory` the memory plan (npurun.memory, issue E)."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub):
    p = sub.add_parser("compile", help="compile a model: passes, calibration, per-node precision")
    p.add_argument("model", help="a .onnx or .npuir file")
    p.add_argument("-o", "--output", help="the compiled .npuir (+ .weights.npz)")
    p.add_argument("--precision", default="auto",
                   choices=("auto", "fp32", "fp16", "bf16", "int8", "int8_acc16", "int16"),
                   help="precision policy (auto: the analyzer's per-node rule; default)")
    p.add_argument("--calibrate", metavar="DIR|random:N",
                   help="calibration inputs: a folder of .npy/.npz/images, or N random inputs "
                        "(default for policies that need ranges: random:4)")
    p.add_argument("--calibration-method", default="minmax", choices=("minmax", "percentile", "mse"),
                   help="which recorded range quantization uses (default: minmax)")
    p.add_argument("--precision-override", metavar="SPEC",
                   help="force precisions: 'Conv=int8,/blocks.3/*=fp16' (op types or node-name globs)")
    p.add_argument("--explain", action="store_true", help="print each node's precision and the reason")
    p.add_argument("--memory", action="store_true", help="print the memory plan (npurun.memory)")
    p.add_argument("--workspace-mb", type=float, default=None,
                   help="fast-memory workspace in MB for --memory and --shape (default: the device's fast tier)")
    p.add_argument("--shape", action="append", metavar="INPUT=DxDx..",
                   help="a concrete input shape: --memory plans for it, and -o then writes the "
                        "placed (and, where needed, split) graph")
    p.add_argument("--device", default="cpu", help="target backend[:device] (default: cpu)")
    p.set_defaults(fn=run)


def explain(g, out=print) -> None:
    """One row per node: index, name, op (with precision suffix), reason; then totals."""
    rows = [(str(i), n.name or "-", n.full_op, n.why) for i, n in enumerate(g.nodes)]
    head = ("#", "node", "op", "why")
    w = [max(len(r[k]) for r in rows + [head]) for k in range(3)]
    out("  ".join(h.ljust(x) for h, x in zip(head[:3], w)) + "  why")
    for r in rows:
        out("  ".join(c.ljust(x) for c, x in zip(r[:3], w)) + "  " + r[3])
    counts: dict[str, int] = {}
    for n in g.nodes:
        counts[n.precision or "fp32/none"] = counts.get(n.precision or "fp32/none", 0) + 1
    out(f"{len(g.nodes)} nodes: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))


def run(args) -> int:
    from ..compiler import DEFAULT_CALIBRATION, compile
    from ..errors import InputError
    from ..ir import save
    if not (args.output or args.explain or args.memory):
        raise InputError("npurun compile: nothing to do; give -o OUT.npuir, --explain or --memory")
    if args.output and Path(args.output).suffix != ".npuir":
        raise InputError(f"{args.output}: the output of compile must end in .npuir")
    g = compile(args.model, precision=args.precision, calibration=args.calibrate,
                overrides=args.precision_override, target=args.device, method=args.calibration_method)
    cal = args.calibrate or (DEFAULT_CALIBRATION + " (default; give --calibrate for real data)"
                             if args.precision not in ("fp32", "bf16") else "none")
    if args.explain:
        print(f"{args.model}: precision {args.precision}, calibration {cal}")
        explain(g)
    from ..backends.npusim.simulate import input_shapes_of
    from ..memory.planner import symbolic_inputs
    shapes = input_shapes_of(g, args.shape)
    if args.memory:
        from ..memory import memory_report
        print(memory_report(g, workspace_mb=args.workspace_mb, device=args.device, shapes=shapes).format())
    if args.output:
        if shapes and not symbolic_inputs(g, shapes):  # write the placed, split graph
            from ..memory import prepare
            g, _ = prepare(g, shapes, device=args.device, workspace_mb=args.workspace_mb)
        save(g, args.output)
        print(f"{args.model} -> {args.output} ({len(g.nodes)} nodes, precision {args.precision}, "
              f"calibration {cal})")
    return 0
