"""Row-wise ops (Softmax, LayerNormalization) alone, npurun's cpu backend against ONNX Runtime.

    python bench/row_ops.py [--threads 1 2] [--time 2]

One-node ONNX models at shapes the corpus runs (YOLOS-tiny's 3 x 677 x 677 attention scores,
BERT-base's 12 x 128 x 128, DeiT-small's 6 x 197 x 197; LayerNorm over YOLOS's 677 x 192 and
BERT's 128 x 768 tokens), random non-zero inputs, both runtimes alternating in one process
(npurun.commands.bench.alternate, no idle: hot), medians; the largest difference from ORT's
outputs is printed with each ratio. Prints, never asserts.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

CASES = [("Softmax", (1, 3, 677, 677)), ("Softmax", (1, 12, 128, 128)), ("Softmax", (1, 6, 197, 197)),
         ("LayerNormalization", (1, 677, 192)), ("LayerNormalization", (1, 128, 768))]


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
    node = helper.make_node(op, ins, ["y"], axis=-1)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def main() -> int:
    import onnxruntime as ort

    import npurun
    from npurun.commands.bench import alternate
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--time", type=float, default=2.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for op, shape in CASES:
            path = Path(tmp) / f"{op}.onnx"
            model(op, shape, path)
            x = {"x": (np.random.default_rng(1).standard_normal(shape) * 3).astype(np.float32)}
            g = npurun.load(path)
            for t in args.threads:
                so = ort.SessionOptions()
                so.intra_op_num_threads, so.inter_op_num_threads = t, 1
                sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
                exe = npurun.Executor("cpu", parallelism=t)
                diff = float(np.abs(exe.run_sync(g, x)["y"] - sess.run(None, x)[0]).max())
                times = alternate({"npurun": lambda: exe.run_sync(g, x), "ort": lambda: sess.run(None, x)},
                                  args.time, 20, settle_s=0)
                a, b = statistics.median(times["npurun"]), statistics.median(times["ort"])
                print(f"{op:18s} {'x'.join(map(str, shape)):14s} {t} thread(s): npurun {a * 1e3:.3f} ms, "
                      f"ORT {b * 1e3:.3f} ms, ratio {a / b:.2f} (max |diff| {diff:.1e})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
