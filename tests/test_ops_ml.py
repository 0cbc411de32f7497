"""ai.onnx.ml ops (ir/ops/ml.py) against ONNX Runtime on fresh random inputs: ArrayFeatureExtractor,
Binarizer, LabelEncoder in its forms, and TreeEnsemble on random forests (every branch mode,
set membership, missing values, every aggregate and post-transform)."""
import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import npurun
from conftest import nonzero_normal
from npurun.frontend.onnx import import_model
from npurun.ir import parse, print_graph, verify

ML = "ai.onnx.ml"


def _model(op, inputs: dict, attrs=None, ml_opset=5, consts=None):
    consts = consts or {}
    node = helper.make_node(op, list(inputs) + list(consts), ["y"], name=f"the_{op.lower()}", domain=ML,
                            **(attrs or {}))

    def info(k, v):
        elem = TensorProto.STRING if v.dtype == object else helper.np_dtype_to_tensor_dtype(v.dtype)
        return helper.make_tensor_value_info(k, elem, list(v.shape))
    g = helper.make_graph([node], f"case_{op}", [info(k, v) for k, v in inputs.items()],
                          [helper.make_empty_tensor_value_info("y")],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(ML, ml_opset)],
                             ir_version=10)


def _check(model, feeds, rtol=1e-5, atol=1e-6, oracle="ort"):
    """npurun against ONNX Runtime, or against onnx.reference where ORT lacks the type."""
    if oracle == "ort":
        (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        (want,) = ReferenceEvaluator(model).run(None, feeds)
    graph = import_model(model)
    got = npurun.Executor("reference", parallelism=1).run_sync(graph, feeds)[graph.outputs[0]]
    assert got.shape == want.shape, (got.shape, want.shape)
    if want.dtype.kind in "OU":
        assert got.dtype == object
        assert got.tolist() == want.astype(object).tolist()
    else:
        assert got.dtype == want.dtype, (got.dtype, want.dtype)
        if want.dtype.kind == "f":
            np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(got, want)
    # the imported graph round-trips through the text format (tables are constants)
    from npurun.ir.text import parse as parse_text
    weights = {v.name: v.data for v in graph.constants()}
    again = verify(parse_text(print_graph(graph), weights=weights))
    again.source = graph.source
    assert again == graph
    return got


# ------------------------------------------------------------------ ArrayFeatureExtractor, Binarizer

@pytest.mark.parametrize("x_shape,idx_shape", [((3, 4, 6), (3,)), ((5, 7), (1, 4)), ((6,), (2,)), ((2, 9), (2, 2))])
def test_array_feature_extractor(rng, x_shape, idx_shape):
    x = nonzero_normal(rng, x_shape)
    idx = rng.integers(0, x_shape[-1], idx_shape).astype(np.int64)
    _check(_model("ArrayFeatureExtractor", {"x": x, "idx": idx}, ml_opset=1), {"x": x, "idx": idx})


def test_array_feature_extractor_out_of_range(rng):
    x, idx = nonzero_normal(rng, (2, 3)), np.array([0, 3], np.int64)
    with pytest.raises(npurun.NpurunError, match="the_arrayfeatureextractor.*out of range"):
        g = import_model(_model("ArrayFeatureExtractor", {"x": x, "idx": idx}, ml_opset=1))
        npurun.Executor("reference").run_sync(g, {"x": x, "idx": idx})


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_binarizer(rng, dtype):
    x = (nonzero_normal(rng, (3, 4, 5)) * 3).astype(dtype)
    threshold = float(rng.normal())
    # ONNX Runtime implements float32 only
    _check(_model("Binarizer", {"x": x}, {"threshold": threshold}, ml_opset=1), {"x": x},
           oracle="ort" if dtype == np.float32 else "onnx.reference")


# ------------------------------------------------------------------ LabelEncoder

def _words(rng, n):
    return np.array(["".join(rng.choice(list("abcdefgh"), 3)) for _ in range(n)], dtype=object)


def test_label_encoder_strings_to_ints(rng):
    keys = list(dict.fromkeys(_words(rng, 12).tolist()))
    x = np.array(rng.choice(keys + ["zzz", "yyy"], (4, 5)), dtype=object)
    attrs = {"keys_strings": keys, "values_int64s": rng.integers(-50, 50, len(keys)).tolist()}
    _check(_model("LabelEncoder", {"x": x}, attrs, ml_opset=4), {"x": x})
    _check(_model("LabelEncoder", {"x": x}, {**attrs, "default_int64": 7}, ml_opset=4), {"x": x})


def test_label_encoder_ints_to_strings_and_floats(rng):
    keys = rng.permutation(40)[:10].astype(np.int64)
    x = rng.integers(0, 40, (3, 7)).astype(np.int64)
    _check(_model("LabelEncoder", {"x": x}, {"keys_int64s": keys.tolist(), "values_strings": _words(rng, 10).tolist(),
                                             "default_string": "none"}, ml_opset=2), {"x": x})
    _check(_model("LabelEncoder", {"x": x}, {"keys_int64s": keys.tolist(),
                                             "values_floats": rng.normal(size=10).tolist()}, ml_opset=2), {"x": x})


def test_label_encoder_float_keys_with_nan(rng):
    keys = np.round(rng.normal(size=6), 1).astype(np.float32)
    keys[2] = np.nan
    x = rng.choice(np.append(keys, [5.5, -7.25]).astype(np.float32), (8,))
    x[0] = np.nan
    _check(_model("LabelEncoder", {"x": x}, {"keys_floats": keys.tolist(), "values_int64s": list(range(6))},
                  ml_opset=4), {"x": x})


def test_label_encoder_tensor_attributes(rng):
    keys = rng.permutation(30)[:8].astype(np.int32)
    x = rng.integers(0, 30, (5, 2)).astype(np.int32)
    attrs = {"keys_tensor": numpy_helper.from_array(keys, "keys_tensor"),
             "values_tensor": numpy_helper.from_array(rng.integers(-9, 9, 8).astype(np.int16), "values_tensor"),
             "default_tensor": numpy_helper.from_array(np.array([42], np.int16), "default_tensor")}
    _check(_model("LabelEncoder", {"x": x}, attrs, ml_opset=4), {"x": x}, oracle="onnx.reference")  # ORT: no int32


def test_label_encoder_opset_1(rng):
    classes = list(dict.fromkeys(_words(rng, 6).tolist()))
    x = np.array(rng.choice(classes + ["qqq"], (7,)), dtype=object)
    _check(_model("LabelEncoder", {"x": x}, {"classes_strings": classes, "default_int64": -3}, ml_opset=1), {"x": x})
    i = rng.integers(-1, len(classes) + 1, (7,)).astype(np.int64)
    _check(_model("LabelEncoder", {"x": i}, {"classes_strings": classes, "default_string": "?"}, ml_opset=1), {"x": i})


def test_label_encoder_key_type_must_match():
    x = np.array(["a"], dtype=object)
    with pytest.raises(npurun.NpurunError, match="the_labelencoder.*same|one type"):
        import_model(_model("LabelEncoder", {"x": x}, {"keys_int64s": [1], "values_int64s": [2]}, ml_opset=4))


# ------------------------------------------------------------------ TreeEnsemble

GRID = np.arange(-2.0, 2.01, 0.5)  # features and splits on one grid, so ==, != and sets matter


def _forest(rng, n_features, n_targets, n_trees, depth=4, modes=range(6)):
    """A random forest in TreeEnsemble's encoding (every mode, set membership, missing values)."""
    t = {k: [] for k in ("featureids", "modes", "splits", "trueids", "trueleafs", "falseids", "falseleafs",
                         "tracks")}
    leaf_t, leaf_w, members = [], [], []

    def leaf():
        leaf_t.append(int(rng.integers(n_targets)))
        leaf_w.append(float(np.float32(rng.normal())))
        return len(leaf_t) - 1, 1

    def node(d, force=False):
        if not force and (d == 0 or rng.random() < 0.25):
            return leaf()
        i = len(t["modes"])
        for k in t:
            t[k].append(0)
        mode = int(rng.choice(list(modes)))
        t["featureids"][i], t["modes"][i], t["tracks"][i] = int(rng.integers(n_features)), mode, int(rng.random() < 0.5)
        if mode == 6:
            # (ONNX Runtime takes integral members only)
            members.extend(rng.choice(GRID[::2], int(rng.integers(1, 4)), replace=False).tolist() + [math.nan])
            t["splits"][i] = math.nan
        else:
            t["splits"][i] = float(rng.choice(GRID))
        t["trueids"][i], t["trueleafs"][i] = node(d - 1)
        t["falseids"][i], t["falseleafs"][i] = node(d - 1)
        return i, 0

    roots = [node(depth, force=True)[0] for _ in range(n_trees)]
    attrs = {"tree_roots": roots, "nodes_featureids": t["featureids"],
             "nodes_modes": numpy_helper.from_array(np.array(t["modes"], np.uint8), "nodes_modes"),
             "nodes_splits": numpy_helper.from_array(np.array(t["splits"], np.float32), "nodes_splits"),
             "nodes_truenodeids": t["trueids"], "nodes_trueleafs": t["trueleafs"],
             "nodes_falsenodeids": t["falseids"], "nodes_falseleafs": t["falseleafs"],
             "nodes_missing_value_tracks_true": t["tracks"], "leaf_targetids": leaf_t,
             "leaf_weights": numpy_helper.from_array(np.array(leaf_w, np.float32), "leaf_weights"),
             "n_targets": n_targets}
    if members:
        attrs["membership_values"] = numpy_helper.from_array(np.array(members, np.float32), "membership_values")
    return attrs


def _rows(rng, n, f, integral=False):
    """Rows on the grid, some off it, some missing (NaN); `integral`: whole numbers only."""
    if integral:
        return rng.choice(GRID[::2], (n, f)).astype(np.float32)
    x = rng.choice(GRID, (n, f)).astype(np.float32) + rng.choice([0.0, 0.25], (n, f)).astype(np.float32)
    x[rng.random((n, f)) < 0.1] = np.nan  # missing values
    return x


def test_tree_ensemble_set_membership(rng):
    """ONNX Runtime tests membership on the feature cast to an integer, so only whole-number
    features are compared with it (npurun tests the value itself, as ONNX specifies: see
    test_tree_ensemble_text_keeps_nan_splits_and_sets)."""
    attrs = _forest(rng, n_features=3, n_targets=3, n_trees=4, modes=range(7))
    x = _rows(rng, 64, 3, integral=True)
    _check(_model("TreeEnsemble", {"x": x}, attrs), {"x": x})


@pytest.mark.parametrize("aggregate", [0, 1, 2, 3])
def test_tree_ensemble_aggregates(rng, aggregate):
    attrs = _forest(rng, n_features=4, n_targets=3, n_trees=5)
    x = _rows(rng, 64, 4)
    _check(_model("TreeEnsemble", {"x": x}, {**attrs, "aggregate_function": aggregate}), {"x": x})


def _spec_transform(s, post):
    """ONNX's post_transform, per row of scores (float64): 1 softmax, 2 logistic, 3 softmax
    that keeps zeros, 4 probit."""
    from scipy.special import erfinv
    if post in (1, 3):
        e = np.exp(s - s.max(axis=1, keepdims=True))
        if post == 3:
            e = np.where(s != 0, e, 0)
        return e / e.sum(axis=1, keepdims=True)
    return 1 / (1 + np.exp(-s)) if post == 2 else math.sqrt(2) * erfinv(2 * s - 1)


@pytest.mark.parametrize("post", [1, 2, 3, 4])
def test_tree_ensemble_post_transforms(rng, post):
    """ONNX Runtime reads post_transform with its own enum (1 logistic, 2 softmax) and applies
    some transforms for one target only (microsoft/onnxruntime#26596), so the oracle is its
    raw scores (post_transform 0) through the transform as ONNX defines it."""
    attrs = _forest(rng, n_features=3, n_targets=4, n_trees=6)
    if post == 4:  # probit takes scores in (0, 1): the average of weights in (0.05, 0.95)
        w = rng.uniform(0.05, 0.95, len(attrs["leaf_targetids"])).astype(np.float32)
        attrs["leaf_weights"] = numpy_helper.from_array(w, "leaf_weights")
        attrs["aggregate_function"] = 0
    x = _rows(rng, 50, 3)
    raw = ort.InferenceSession(_model("TreeEnsemble", {"x": x}, attrs).SerializeToString(),
                               providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    g = import_model(_model("TreeEnsemble", {"x": x}, {**attrs, "post_transform": post}))
    got = npurun.Executor("reference", parallelism=1).run_sync(g, {"x": x})[g.outputs[0]]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, _spec_transform(raw.astype(np.float64), post), rtol=1e-5, atol=1e-6)


def test_tree_ensemble_double_and_a_single_leaf_tree(rng):
    attrs = _forest(rng, n_features=2, n_targets=2, n_trees=3, modes=range(6))
    for k in ("nodes_splits", "leaf_weights"):
        attrs[k] = numpy_helper.from_array(numpy_helper.to_array(attrs[k]).astype(np.float64), k)
    x = _rows(rng, 30, 2).astype(np.float64)
    _check(_model("TreeEnsemble", {"x": x}, attrs), {"x": x})
    # a tree that is one leaf: one node whose branches both point to it
    one = {"tree_roots": [0], "nodes_featureids": [0],
           "nodes_modes": numpy_helper.from_array(np.array([0], np.uint8), "nodes_modes"),
           "nodes_splits": numpy_helper.from_array(np.array([0.0]), "nodes_splits"),
           "nodes_truenodeids": [0], "nodes_trueleafs": [1], "nodes_falsenodeids": [0], "nodes_falseleafs": [1],
           "leaf_targetids": [1], "leaf_weights": numpy_helper.from_array(np.array([2.5]), "leaf_weights"),
           "n_targets": 2}
    _check(_model("TreeEnsemble", {"x": x}, one), {"x": x})


def test_tree_ensemble_checks_its_tables(rng):
    attrs = _forest(rng, n_features=2, n_targets=2, n_trees=1)
    attrs["leaf_targetids"] = [5] * len(attrs["leaf_targetids"])
    with pytest.raises(npurun.NpurunError, match="the_treeensemble.*leaf_targetids"):
        import_model(_model("TreeEnsemble", {"x": np.zeros((1, 2), np.float32)}, attrs))


def test_tree_ensemble_text_keeps_nan_splits_and_sets():
    text = """npuir 1
graph g
input x: [N, 1] f32 DRAM0
const splits: [2] f32 DRAM0 = [nan, 0.5]
const weights: [3] f32 DRAM0 = [1.0, 2.0, 3.0]
const sets: [3] f32 DRAM0 = [1.0, 2.0, nan]
op tree_ensemble (x: [N, 1] f32 DRAM0, splits: [2] f32 DRAM0, weights: [3] f32 DRAM0, sets: [3] f32 DRAM0 -> y: [N, 2] f32 DRAM0) tree_roots=[0] nodes_featureids=[0, 0] nodes_modes=[6, 0] nodes_truenodeids=[0, 1] nodes_trueleafs=[1, 1] nodes_falsenodeids=[1, 2] nodes_falseleafs=[0, 1] leaf_targetids=[0, 1, 1] n_targets=2
"""
    g = verify(parse(text))
    assert parse(print_graph(g)) == g
    x = np.array([[1.0], [2.0], [0.25], [3.0]], np.float32)
    y = npurun.Executor("reference").run_sync(g, {"x": x})["y"]
    np.testing.assert_array_equal(y, [[1, 0], [1, 0], [0, 2], [0, 3]])
