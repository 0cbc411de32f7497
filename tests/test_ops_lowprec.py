"""fp16/bf16 arithmetic of the reference kernels against ONNX's reference evaluator (an
independent implementation) on fresh random inputs: products keep the operand type, convs
accumulate in float32 and round once, Attention rounds where its ONNX function body does,
SwiGLU (opset 28) is Swish(A) * B."""
import ml_dtypes
import numpy as np
import pytest
from onnx import helper
from onnx.backend.test.case.node import function_testcase_helper
from onnx.reference import ReferenceEvaluator

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model

BF16 = np.dtype(ml_dtypes.bfloat16)


def _model(op, inputs: dict, attrs=None, opset=23, n_out=1):
    node = helper.make_node(op, list(inputs), [f"y{i}" for i in range(n_out)], name=f"the_{op.lower()}",
                            **(attrs or {}))
    g = helper.make_graph(
        [node], f"case_{op}",
        [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
         for k, v in inputs.items()],
        [helper.make_empty_tensor_value_info(f"y{i}") for i in range(n_out)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)


def _run(model, feeds):
    graph = import_model(model)
    out = npurun.Executor("reference", parallelism=1).run_sync(graph, feeds)
    return [out[n] for n in graph.outputs], graph


def _same_bits(got, want):
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_matmul_keeps_the_operand_type(rng, dtype):
    feeds = {"a": nonzero_normal(rng, (2, 3, 5, 7)).astype(dtype), "b": nonzero_normal(rng, (7, 4)).astype(dtype)}
    model = _model("MatMul", feeds, opset=22)
    (got,), graph = _run(model, feeds)
    assert graph.values[graph.outputs[0]].dtype == ("bf16" if dtype == BF16 else "f16")
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    _same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.float16, BF16])
def test_conv_accumulates_in_float32(rng, dtype):
    """One rounding at the end: exactly the float32 result rounded to the storage type."""
    x = nonzero_normal(rng, (2, 6, 9, 8)).astype(dtype)
    w = nonzero_normal(rng, (4, 3, 3, 3)).astype(dtype)
    model = _model("Conv", {"x": x, "w": w}, {"group": 2, "pads": [1, 1, 1, 1]}, opset=22)
    (got,), _ = _run(model, {"x": x, "w": w})
    f32 = import_model(_model("Conv", {"x": x.astype(np.float32), "w": w.astype(np.float32)},
                              {"group": 2, "pads": [1, 1, 1, 1]}, opset=22))
    want = npurun.Executor("reference", parallelism=1).run_sync(
        f32, {"x": x.astype(np.float32), "w": w.astype(np.float32)})[f32.outputs[0]]
    # float32 sums of a few dozen products differ from exact ones far below half an fp16 ulp
    _same_bits(got, want.astype(dtype))


@pytest.mark.parametrize("dtype", [np.float16, BF16])
@pytest.mark.parametrize("case", ["causal_3d", "mask_4d", "softcap_gqa"])
def test_attention_rounds_like_its_function_body(rng, dtype, case):
    if case == "causal_3d":
        feeds = {"Q": rng.random((2, 4, 24)), "K": rng.random((2, 6, 24)), "V": rng.random((2, 6, 24))}
        attrs = {"is_causal": 1, "q_num_heads": 3, "kv_num_heads": 3}
    elif case == "mask_4d":
        feeds = {"Q": rng.random((2, 3, 4, 8)), "K": rng.random((2, 3, 6, 8)), "V": rng.random((2, 3, 6, 8)),
                 "attn_mask": rng.random((4, 6))}
        attrs = {}
    else:
        feeds = {"Q": rng.random((1, 4, 5, 8)), "K": rng.random((1, 2, 7, 8)), "V": rng.random((1, 2, 7, 8))}
        attrs = {"softcap": 2.0, "scale": 0.3}
    feeds = {k: (v + 0.05).astype(dtype) for k, v in feeds.items()}
    model = _model("Attention", feeds, attrs)
    (got,), _ = _run(model, feeds)
    (want,) = ReferenceEvaluator(_function_body(model)).run(None, feeds)
    _same_bits(got, want)


def _function_body(model):
    """The model with its one node replaced by the op's ONNX function body, the definition
    of the op's rounding. (onnx.reference's own Attention computes softcap in float32 for
    bfloat16 operands, by NumPy's promotion of bfloat16 / float.)"""
    node = model.graph.node[0]
    [(nodes, opsets)] = function_testcase_helper(node, [i.type for i in model.graph.input], "body",
                                                 opset_imports=list(model.opset_import))[0][:1]
    g = helper.make_graph(nodes, "body", list(model.graph.input), list(model.graph.output))
    return helper.make_model(g, opset_imports=opsets, ir_version=10)


@pytest.mark.parametrize("dtype,alpha", [(np.float32, None), (np.float32, 0.7), (np.float16, None)])
def test_swiglu(rng, dtype, alpha):
    feeds = {"a": nonzero_normal(rng, (3, 4, 6)).astype(dtype), "b": nonzero_normal(rng, (3, 4, 6)).astype(dtype)}
    model = _model("SwiGLU", feeds, {} if alpha is None else {"alpha": alpha}, opset=28)
    (got,), _ = _run(model, feeds)
    (want,) = ReferenceEvaluator(model).run(None, feeds)
    assert got.dtype == want.dtype
    # float16: the reference rounds to float16 inside Swish (alpha * a, sigmoid, the product)
    # and after Mul, npurun after Swish and after Mul: a half-step (2^-11) each, 6 in all, and
    # sigmoid carries its input's; 8 half-steps (seed 279666061 met 4.2, over the old 2e-3)
    np.testing.assert_allclose(got, want, rtol=8 * 2.0 ** -11 if dtype == np.float16 else 1e-6, atol=1e-6)


def test_swiglu_refuses_broadcasting():
    model = _model("SwiGLU", {"a": np.ones((2, 4), np.float32), "b": np.ones((1, 4), np.float32)}, opset=28)
    with pytest.raises(npurun.NpurunError, match="one shape"):
        import_model(model)
