"""Depthwise convs one node at a time: npurun's cpu kernels (per channel, conv.c; channels in
the lanes, dwconv_cl.c; on AVX-512 a small plane as one flat row, dwconv_flat.c, where it fits)
called directly, and ONNX Runtime on the same single-node model, alternating in this process
(medians; ratio of the kernel the rule picks, nativeconv.dw_flat_chosen then dw_lanes_chosen,
to ORT).

    python bench/dwconv.py [--threads 1] [--time 1]

The shapes are those of the corpus's depthwise-heavy models (MobileNetV2/V3, EfficientNet,
PP-LCNet, ConvNeXt's 7x7): 3x3 and 5x5 at stride 1 and 2 on 112..7 maps, 7x7 on 56..7.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (C, H=W, k, stride)
SHAPES = [(32, 112, 3, 1), (96, 112, 3, 2), (144, 56, 3, 1), (144, 56, 3, 2), (192, 28, 3, 1),
          (192, 28, 3, 2), (384, 14, 3, 1), (576, 14, 3, 1), (576, 14, 3, 2), (960, 7, 3, 1),
          (240, 28, 5, 1), (480, 14, 5, 1), (672, 14, 5, 2), (1152, 7, 5, 1), (96, 56, 7, 1),
          (384, 14, 7, 1), (768, 7, 7, 1)]


def model(c, hw, k, s):
    from onnx import TensorProto, helper, numpy_helper
    w = np.random.default_rng(0).standard_normal((c, 1, k, k)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=c, kernel_shape=[k, k], strides=[s, s],
                            pads=[k // 2] * 4)
    g = helper.make_graph([node], "dw", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, hw, hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                          [numpy_helper.from_array(w, "w")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--time", type=float, default=1.0, help="seconds of alternating runs per shape")
    args = ap.parse_args()
    import onnxruntime as ort

    from onnx import numpy_helper
    from npurun.backends.cpu import native, nativeconv
    print("| C | HxW | k | stride | per-channel us | lanes us | flat us | ORT us | chosen / ORT |")
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for c, hw, k, s in SHAPES:
        m = model(c, hw, k, s)
        x = np.random.default_rng(1).standard_normal((1, c, hw, hw)).astype(np.float32)
        w = numpy_helper.to_array(m.graph.initializer[0])
        attrs = {"group": c, "strides": [s, s], "dilations": [1, 1], "pads": [k // 2] * 4, "auto_pad": "NOTSET"}
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = args.threads, 1
        sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
        want = sess.run(None, {"x": x})[0]
        ho = (hw + 2 * (k // 2) - k) // s + 1
        geo = (k, k, s, s, 1, 1, k // 2, k // 2)
        flat = native.ISA == "avx512" and nativeconv.dw_flat_fits(hw, hw, geo, ho, ho)
        caches = {"direct": {}, "dw_lanes": {}, **({"dw_flat": {}} if flat else {})}
        runs = {a: (lambda a=a: nativeconv.conv2d(x, w, None, attrs, None, {}, args.threads, caches[a], algo=a))
                for a in caches}
        for a, f in runs.items():
            np.testing.assert_allclose(f(), want, rtol=1e-4, atol=1e-4)
        runs["ort"] = lambda: sess.run(None, {"x": x})
        times = {a: [] for a in runs}
        end = time.perf_counter() + args.time
        while time.perf_counter() < end or len(times["ort"]) < 20:
            for a, f in runs.items():
                t = time.perf_counter()
                f()
                times[a].append(time.perf_counter() - t)
        us = {a: 1e6 * statistics.median(v) for a, v in times.items()}
        pick = "dw_flat" if flat and nativeconv.dw_flat_chosen(geo, ho) else \
            "dw_lanes" if nativeconv.dw_lanes_chosen(c, ho, s, native.ISA, k) else "direct"
        ratios.append(us[pick] / us["ort"])
        name = {"dw_flat": "flat", "dw_lanes": "lanes", "direct": "per-channel"}[pick]
        flat_us = f"{us['dw_flat']:.0f}" if flat else "-"
        print(f"| {c} | {hw} | {k} | {s} | {us['direct']:.0f} | {us['dw_lanes']:.0f} | {flat_us} | {us['ort']:.0f} | "
              f"**{ratios[-1]:.2f}** ({name}) |")
    print(f"\ngeometric mean chosen / ORT {np.exp(np.mean(np.log(ratios))):.2f} over {len(ratios)} shapes, "
          f"{args.threads} thread(s)")


if __name__ == "__main__":
    main()
