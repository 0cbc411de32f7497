"""Helpers of the contrib op tests: one ONNX node run by ONNX Runtime (the oracle, in tests
only) and by npurun's reference and cpu backends."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

from ort_exact import u8_weights

import npurun

MS = "com.microsoft"
BACKENDS = ("reference", "cpu")


def node_model(op_type, inputs, n_out=1, attrs=None, domain=MS, consts=(), opset=17, out_names=None):
    """A one-node model. `inputs` is a list of (name, array) or None (an absent optional
    operand); names in `consts` become initializers, the others graph inputs."""
    ins, inits, names = [], [], []
    for item in inputs:
        if item is None:
            names.append("")
            continue
        nm, arr = item
        names.append(nm)
        if nm in consts:
            inits.append(numpy_helper.from_array(np.asarray(arr), nm))
        else:
            ins.append(helper.make_tensor_value_info(nm, helper.np_dtype_to_tensor_dtype(np.asarray(arr).dtype),
                                                     list(np.shape(arr))))
    outs = list(out_names or [f"y{i}" for i in range(n_out)])
    node = helper.make_node(op_type, names, outs, domain=domain, name="n0", **(attrs or {}))
    g = helper.make_graph([node], "t", ins, [onnx.ValueInfoProto(name=o) for o in outs if o],
                          initializer=inits)
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    m = helper.make_model(g, opset_imports=opsets)
    m.ir_version = 10
    return m


def typed(m, graph):
    """`m` with its outputs typed as npurun infers them (ONNX Runtime wants typed outputs)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    for o in m.graph.output:
        v = graph.values[o.name]
        dt = helper.np_dtype_to_tensor_dtype(np.dtype(npurun.ir.dtypes.to_numpy(v.dtype)))
        shape = [d if isinstance(d, int) else None for d in v.shape]
        o.CopyFrom(helper.make_tensor_value_info(o.name, dt, shape))
    return m


def run_all(m, feeds, tmp_path, backends=BACKENDS):
    """(ONNX Runtime's outputs, {backend: npurun's outputs}) for a model and its feeds."""
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    g = npurun.load(path)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # the op as written
    # One thread: some of ORT's kernels quantize per thread's share of a batch (its quantized
    # LSTM), so their numbers depend on the thread count.
    so.intra_op_num_threads = 1
    oracle, ofeeds = u8_weights(typed(m, g), feeds)  # exact on every x86 (tests/ort_exact.py)
    sess = ort.InferenceSession(oracle.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in m.graph.output]
    want = dict(zip(names, sess.run(names, ofeeds)))
    got = {b: npurun.Executor(device=b).run_sync(g, feeds) for b in backends}
    return want, got


def check_like(m, oracle, feeds, tmp_path, *, atol=1e-5, rtol=1e-5, backends=BACKENDS, oracle_feeds=None):
    """For ops or forms ONNX Runtime runs on CUDA only: npurun on `m` equals ONNX Runtime on
    `oracle`, the same computation written in ops (or forms) its CPU kernels take (same output
    names; `oracle_feeds` where its inputs differ)."""
    path = tmp_path / "m.onnx"
    onnx.save(m, path)
    g = npurun.load(path)
    sess = ort.InferenceSession(oracle.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in oracle.graph.output]
    want = dict(zip(names, sess.run(names, feeds if oracle_feeds is None else oracle_feeds)))
    for b in backends:
        got = npurun.Executor(device=b).run_sync(g, feeds)
        for k, w in want.items():
            assert got[k].shape == w.shape and got[k].dtype == w.dtype, f"{b} {k}"
            np.testing.assert_allclose(got[k], w, atol=atol, rtol=rtol, err_msg=f"{b} {k}")
    return want


def check(m, feeds, tmp_path, *, atol=1e-5, rtol=1e-5, steps=None, backends=BACKENDS, flips=None):
    """Every output of every backend equals ONNX Runtime's: within atol/rtol for floats,
    within `steps` quantization steps for integer outputs (0 when None: exact), at most 1% of
    them off at all. `flips` (bound, share): for float outputs of a chain that quantizes its
    activations on the fly, where a value computed a few ulp apart (ORT's polynomial sigmoid)
    can land on the other side of a rounding step and carry that step on — every value within
    `bound`, and at least `share` of them within atol/rtol. Returns ONNX Runtime's outputs."""
    want, got = run_all(m, feeds, tmp_path, backends)
    for b, outs in got.items():
        for k, w in want.items():
            y = outs[k]
            assert y.shape == w.shape, f"{b} {k}: shape {y.shape}, ONNX Runtime {w.shape}"
            assert y.dtype == w.dtype, f"{b} {k}: dtype {y.dtype}, ONNX Runtime {w.dtype}"
            if w.dtype.kind in "iu":
                diff = np.abs(y.astype(np.int64) - w.astype(np.int64))
                assert diff.max(initial=0) <= (steps or 0), f"{b} {k}: off by {diff.max()} steps"
                # A step apart only where a float rounding lands differently: rare, never systematic.
                assert np.mean(diff > 0) <= 0.01, f"{b} {k}: {np.mean(diff > 0):.1%} of values differ"
            elif flips is not None:
                bound, share = flips
                np.testing.assert_allclose(y, w, atol=bound, rtol=0, err_msg=f"{b} {k}")
                tight = np.isclose(y, w, atol=atol, rtol=rtol)
                assert tight.mean() >= share, f"{b} {k}: {tight.mean():.1%} within atol {atol}, rtol {rtol}"
            else:
                np.testing.assert_allclose(y, w, atol=atol, rtol=rtol, err_msg=f"{b} {k}")
    return want


def quantized(rng, shape, dtype=np.uint8):
    """Random quantized values spread over the type's range (never all one value)."""
    info = np.iinfo(dtype)
    q = rng.integers(info.min, info.max + 1, size=shape).astype(dtype)
    assert np.unique(q).size > 1 or q.size < 2
    return q


def scale(rng, lo=0.005, hi=0.05):
    return np.array(rng.uniform(lo, hi), np.float32)
