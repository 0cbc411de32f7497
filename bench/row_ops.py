"""Row-wise and transcendental ops alone (Softmax, LayerNormalization, GELU), npurun's cpu
backend against ONNX Runtime.

    python bench/row_ops.py [--threads 1 2] [--time 2]

One-node ONNX models at shapes the corpus runs (YOLOS-tiny's 3 x 677 x 677 attention scores,
BERT-base's 12 x 128 x 128, DeiT-small's 6 x 197 x 197; LayerNorm over YOLOS's 677 x 192 and
BERT's 128 x 768 tokens; GELU as exporters write it, x * 0.5 * (1 + erf(x / sqrt 2)), which
both runtimes fuse, over YOLOS's 677 x 768 and BERT's 128 x 3072), random non-zero inputs, both runtimes alternating in one process
(npurun.commands.bench.alternate, no idle: hot), medians; the largest difference from ORT's
outputs is printed with each ratio. Prints, never asserts.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

CASES = [("Softmax", (1, 3, 677, 677)), ("Softmax", (1, 12, 128, 128)), ("Softmax", (1, 6, 197, 197)),
         ("LayerNormalization", (1, 677, 192)), ("LayerNormalization", (1, 128, 768)),
         ("Gelu", (1, 677, 768)), ("Gelu", (1, 128, 3072))]


def model(op: str, shape, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    inits, ins = [], ["x"]
    if op == "LayerNormalization":
        c = shape[-1]
        inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(c)).astype(np.float32), "g"),
                 numpy_helper.from_array((0.1 * rng.standard_normal(c)).astype(np.float32), "b")]
        ins += ["g", "b"]
    if op == "Gelu":  # the exported form
        inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in
                 (("sq2", np.sqrt(2.0)), ("one", 1.0), ("half", 0.5))]
        nodes = [helper.make_node("Div", ["x", "sq2"], ["t"]), helper.make_node("Erf", ["t"], ["e"]),
                 helper.make_node("Add", ["e", "one"], ["u"]), helper.make_node("Mul", ["x", "u"], ["v"]),
                 helper.make_node("Mul", ["v", "half"], ["y"])]
    else:
        nodes = [helper.make_node(op, ins, ["y"], axis=-1)]
    g = helper.make_graph(nodes, op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def main() -> int:
    from one_node import against_ort
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--time", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for op, shape in CASES:
            path = Path(tmp) / f"{op}.onnx"
            model(op, shape, path)
            x = {"x": (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)}
            for t in args.threads:
                a, b, diff = against_ort(path, x, t, args.time)
                print(f"{op:18s} {'x'.join(map(str, shape)):14s} {t} thread(s): npurun {a * 1e3:.3f} ms, "
                      f"ORT {b * 1e3:.3f} ms, ratio {a / b:.2f} (max |diff| {diff:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
