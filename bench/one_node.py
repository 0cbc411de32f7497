"""One ONNX model (a node or a few, as a benchmark builds it) on npurun's cpu backend and on
ONNX Runtime's CPU provider, alternating in this process (npurun.commands.bench.alternate, no
idle between calls: hot), at one thread count: the shared loop of bench/recurrent.py and
bench/row_ops.py."""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np


def against_ort(path: Path, feeds: dict, threads: int, seconds: float) -> tuple[float, float, float]:
    """(npurun's median seconds, ORT's, the largest |difference| of the first outputs)."""
    import onnxruntime as ort

    import npurun
    from npurun.commands.bench import alternate
    g = npurun.load(path)
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    exe = npurun.Executor("cpu", parallelism=threads)
    ours = exe.run_sync(g, feeds)
    diff = float(np.abs(ours[g.outputs[0]] - sess.run(None, feeds)[0]).max())
    times = alternate({"npurun": lambda: exe.run_sync(g, feeds), "ort": lambda: sess.run(None, feeds)},
                      seconds, 20, settle_s=0)
    return statistics.median(times["npurun"]), statistics.median(times["ort"]), diff
