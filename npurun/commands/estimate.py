"""`npurun estimate MODEL --device x-elite-hexagon`: what the model would cost on an NPU, from
npusim's calibrated device model (no NPU needed): a Vela-style summary, and optionally JSON, a
per-node CSV and a Chrome trace. MODEL is a .onnx / .npuir file, the name of a calibration
architecture (npurun/zoo/architectures: resnet50, yolov8_det, real_esrgan_x4plus, ...), or of a
pipeline (backends/npusim/pipelines.py: an LLM of the AI Hub table, whisper_tiny, whisper_base,
stable_diffusion_v1_5). Every graph is timed as npusim_view makes it (the standard passes and
the fusions the NPU converter does)."""
from __future__ import annotations

from pathlib import Path


from ..backends.npusim.model import PRECISION_CHOICES


def add_parser(sub):
    p = sub.add_parser("estimate", help="estimate latency, energy and temperature on a simulated NPU (npusim)")
    p.add_argument("model", help="a .onnx / .npuir file, or a calibration architecture name")
    p.add_argument("--device", default="x-elite-hexagon",
                   help="a device of npurun/devices (x-elite-hexagon, edge-npu-1t) or a path to a device .toml")
    p.add_argument("--precision", default="auto", choices=PRECISION_CHOICES,
                   help="precision of every node (auto: each node's own, float as fp16; a pipeline's own default: "
                        "LLMs w4a16, Stable Diffusion w8a16, Whisper fp16); w8a16/w4a16: 8/4-bit weights, "
                        "16-bit activations")
    p.add_argument("--steps", type=int, default=20, help="Stable Diffusion: denoising steps (default 20)")
    p.add_argument("--shape", action="append", metavar="INPUT=DxDx..", help="shape of a symbolic input")
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="a real input value, for models whose shapes depend on values (e.g. sr=16000)")
    p.add_argument("--sustained", type=float, default=0.0, metavar="SECONDS",
                   help="also run back-to-back inferences for this long in simulated time (thermal + DVFS)")
    p.add_argument("--json", metavar="PATH", help="write the summary as JSON")
    p.add_argument("--csv", metavar="PATH", help="write one row per node")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace (open in ui.perfetto.dev)")
    p.set_defaults(fn=run)


def _load(spec: str):
    from ..errors import ModelError
    from ..zoo.architectures import ARCHITECTURES, build
    if not Path(spec).exists() and spec in ARCHITECTURES:
        return build(spec)
    if not Path(spec).exists():
        raise ModelError(f"{spec}: no such file, and not an architecture name "
                         f"({', '.join(ARCHITECTURES)})")
    from ..frontend import load
    return load(spec)


def run(args) -> int:
    from ..backends.npusim.pipelines import pipeline_kind, run_pipeline
    from ..backends.npusim.simulate import estimate, input_shapes_of
    from ..backends.npusim.view import npusim_view
    from ..devices import load_device
    dev = load_device(args.device)  # a bad device file fails before the model is read
    if not Path(args.model).exists() and pipeline_kind(args.model):
        rep = run_pipeline(args.model, dev, args.precision, steps=args.steps)
        print(rep.summary())
        if args.csv or args.trace or args.sustained:
            print("note: --csv, --trace and --sustained apply to one graph; estimate a component by its "
                  "architecture name for them")
        if args.json:
            rep.write_json(args.json)
            print(f"wrote {args.json}")
        return 0
    g = _load(args.model)
    from ..cli import _load_array
    values = dict(_load_array(s) for s in args.input or [])
    shapes = {**{k: v.shape for k, v in values.items()}, **input_shapes_of(g, args.shape)}
    g = npusim_view(g, shapes)
    rep = estimate(g, dev, shapes, args.precision, args.sustained, inputs=values)
    print(rep.summary())
    for path, write in ((args.json, rep.write_json), (args.csv, rep.write_csv), (args.trace, rep.write_trace)):
        if path:
            write(path)
            print(f"wrote {path}")
    return 0
