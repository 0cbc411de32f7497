"""Scan-8 (a batch axis on every operand) imported as a loop over the batch of opset-9 scans,
against ONNX Runtime on fresh random inputs."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model
from npurun.ir import parse, print_graph, verify

F = TensorProto.FLOAT


def _scan8(batch, seq, directions, lens=None):
    """Two states (a running sum and a running max of the product of two scan inputs) and two
    scan outputs per step."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["a", "b"], ["p"]),
         helper.make_node("Add", ["s_in", "p"], ["s_out"]),
         helper.make_node("Max", ["m_in", "p"], ["m_out"]),
         helper.make_node("Identity", ["s_out"], ["s_scan"]),
         helper.make_node("Sub", ["m_out", "s_out"], ["d_scan"])],
        "body",
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_in", "m_in", "a", "b")],
        [helper.make_tensor_value_info(n, F, [4]) for n in ("s_out", "m_out", "s_scan", "d_scan")])
    node = helper.make_node("Scan", ["lens" if lens is not None else "", "s0", "m0", "xa", "xb"],
                            ["s", "m", "ys", "yd"], num_scan_inputs=2, body=body, directions=directions)
    g = helper.make_graph([node], "g",
                          [helper.make_tensor_value_info("s0", F, [batch, 4]),
                           helper.make_tensor_value_info("m0", F, [batch, 4]),
                           helper.make_tensor_value_info("xa", F, [batch, seq, 4]),
                           helper.make_tensor_value_info("xb", F, [batch, seq, 4])],
                          [helper.make_empty_tensor_value_info(n) for n in ("s", "m", "ys", "yd")],
                          [] if lens is None else [numpy_helper.from_array(lens, "lens")])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 8)], ir_version=7)


@pytest.mark.parametrize("directions", [[0, 0], [1, 0]])
@pytest.mark.parametrize("with_lens", [False, True])
def test_scan8_matches_onnxruntime(rng, directions, with_lens):
    batch, seq = 3, 5
    lens = np.full(batch, seq, np.int64) if with_lens else None
    model = _scan8(batch, seq, directions, lens)
    feeds = {"s0": nonzero_normal(rng, (batch, 4)), "m0": nonzero_normal(rng, (batch, 4)),
             "xa": nonzero_normal(rng, (batch, seq, 4)), "xb": nonzero_normal(rng, (batch, seq, 4))}
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    g = import_model(model)
    assert [n.op for n in g.nodes] == ["loop"]
    got = npurun.Executor("reference", parallelism=1).run_sync(g, feeds)
    for name, w in zip(g.outputs, want):
        assert got[name].shape == w.shape
        np.testing.assert_allclose(got[name], w, rtol=1e-6, atol=1e-6)
    again = verify(parse(print_graph(g), weights={v.name: v.data for v in g.constants()}))
    again.source = g.source
    assert again == g


def test_scan8_with_shorter_sequence_lens_is_refused():
    model = _scan8(2, 5, [0, 0], np.array([5, 3], np.int64))
    with pytest.raises(npurun.NpurunError, match="sequence_lens shorter"):
        import_model(model)
