"""Every reference kernel (through the ONNX importer) against ONNX Runtime on fresh random
inputs. ORT is the independent oracle here; npurun's kernels are its own."""
import numpy as np
import onnxruntime as ort
import pytest

import npurun
from npurun.frontend.onnx import import_model
from onnx_cases import cases, single_node_model

_IDS = [c[0] for c in cases(np.random.default_rng(0))]


@pytest.mark.parametrize("case_id", _IDS)
@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_kernel_matches_onnxruntime(case_id, device, rng):
    (_, op, ins, consts, attrs, opset, n_out), = [c for c in cases(rng) if c[0] == case_id]
    model = single_node_model(op, ins, consts, attrs, opset, n_out)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, ins)
    graph = import_model(model)
    got = npurun.Executor(device, parallelism=1).run_sync(graph, ins)
    assert list(got) == [f"y{i}" for i in range(n_out)]
    for g, w in zip(got.values(), want):
        assert g.dtype == w.dtype, (g.dtype, w.dtype)
        assert g.shape == w.shape, (g.shape, w.shape)
        if w.dtype.kind == "f":
            np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        else:
            np.testing.assert_array_equal(g, w)


def test_inferred_shapes_match_computed_shapes(rng):
    """npurun's own shape inference agrees with what the kernels compute, case by case."""
    for (cid, op, ins, consts, attrs, opset, n_out) in cases(rng):
        graph = import_model(single_node_model(op, ins, consts, attrs, opset, n_out))
        got = npurun.Executor("reference").run_sync(graph, ins)
        for name, arr in got.items():
            declared = graph.values[name].shape
            assert len(declared) == arr.ndim, cid
            for d, n in zip(declared, arr.shape):
                assert d == n or d == "?", (cid, declared, arr.shape)
