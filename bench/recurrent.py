"""One LSTM or GRU node, npurun's cpu backend against ONNX Runtime's CPU provider.

    python bench/recurrent.py [--op lstm|gru] [--hidden 512] [--input 512] [--seq 20]
                              [--direction bidirectional] [--threads 1 2] [--time 3]

A one-node ONNX model with random weights (shapes of ddddocr's OCR head by default: a
bidirectional 512-wide LSTM over 20 steps), both runtimes alternating in one process
(npurun.commands.bench.alternate, no idle between calls: hot weights), medians; the largest
difference from ORT's outputs is printed with the ratio.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]


def model(op: str, hidden: int, size: int, seq: int, direction: str, path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper, numpy_helper
    dirs, gates = (2 if direction == "bidirectional" else 1), (4 if op == "lstm" else 3)
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((dirs, gates * hidden, size)) * 0.05).astype(np.float32)
    r = (rng.standard_normal((dirs, gates * hidden, hidden)) * 0.05).astype(np.float32)
    b = (rng.standard_normal((dirs, 2 * gates * hidden)) * 0.05).astype(np.float32)
    node = helper.make_node(op.upper(), ["x", "W", "R", "B"], ["y"], direction=direction, hidden_size=hidden)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, 1, size])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [seq, dirs, 1, hidden])],
                          [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"),
                           numpy_helper.from_array(b, "B")])
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def main() -> int:
    from one_node import against_ort
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", choices=("lstm", "gru"), default="lstm")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--input", type=int, default=512)
    ap.add_argument("--seq", type=int, default=20)
    ap.add_argument("--direction", choices=("forward", "reverse", "bidirectional"), default="bidirectional")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--time", type=float, default=3.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "rnn.onnx"
        model(args.op, args.hidden, args.input, args.seq, args.direction, path)
        x = {"x": np.random.default_rng(1).standard_normal((args.seq, 1, args.input)).astype(np.float32)}
        print(f"{args.op} {args.direction}, hidden {args.hidden}, input {args.input}, {args.seq} steps")
        for t in args.threads:
            a, b, diff = against_ort(path, x, t, args.time)
            print(f"  {t} thread(s): npurun {a * 1e3:.3f} ms, ORT {b * 1e3:.3f} ms, ratio {a / b:.2f} "
                  f"(max |diff| {diff:.1e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
