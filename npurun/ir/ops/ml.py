"""Classical machine-learning ops (ONNX's ai.onnx.ml domain): feature selection, thresholding,
label mapping and tree ensembles.

Their tables are constant operands rather than attributes, so they keep their element type
(a split is compared in the input's float type, a label may be any type), large forests live
in the weights file, and NaNs (tree splits, set-membership separators, float keys) compare
bit for bit in the text round trip.

- `array_feature_extractor(x, indices)`: x[..., indices]; a 1-D x gives one row, (1, n).
- `binarizer(x)`: 1 where x > threshold, else 0, in x's type.
- `label_encoder(x, keys, values, default)`: each element of x found in `keys` becomes the
  `values` entry at the same position, any other the scalar `default`; a NaN key matches NaN.
- `tree_ensemble(x, nodes_splits, leaf_weights, membership_values?)`: x is (N, F); each tree
  of `tree_roots` routes a row from its root through interior nodes (nodes_*: feature, mode,
  true/false child and whether that child is a leaf) to one leaf (leaf_*: target, weight); per
  target the leaf weights aggregate (sum, average over trees, min, max) and `post_transform`
  applies per row. Modes are ONNX's: 0 <=, 1 <, 2 >=, 3 >, 4 ==, 5 !=, 6 member of a set
  (the sets are `membership_values` in mode-6 node order, each ended by NaN).
"""
from __future__ import annotations

from ..dtypes import FLOAT_TYPES
from ..shapes import UNKNOWN, numel
from . import REQUIRED, _fail, op

_ML = {"ml"}
AGGREGATES = ("average", "sum", "min", "max")  # ONNX's 0..3
POST_TRANSFORMS = ("none", "softmax", "logistic", "softmax_zero", "probit")  # ONNX's 0..4
MODES = ("leq", "lt", "gte", "gt", "eq", "neq", "member")  # ONNX's 0..6 (nodes_modes holds ints)


@op("array_feature_extractor", ["x", "indices"], groups=_ML)
def _array_feature_extractor(node, a, ins):
    x, idx = ins
    if idx.dtype != "i64":
        _fail(node, f"indices {idx.name!r} are {idx.dtype}; expected i64")
    if x.shape is not None and len(x.shape) == 0:
        _fail(node, "x must have rank >= 1")
    n = numel(idx.shape) if idx.shape is not None else None
    n = UNKNOWN if n is None else n
    if x.shape is None:
        return [(None, x.dtype)]
    lead = (1,) if len(x.shape) == 1 else tuple(x.shape[:-1])
    return [(lead + (n,), x.dtype)]


@op("binarizer", ["x"], attrs={"threshold": 0.0}, groups=_ML)
def _binarizer(node, a, ins):
    return [(ins[0].shape, ins[0].dtype)]


@op("label_encoder", ["x", "keys", "values", "default"], groups=_ML)
def _label_encoder(node, a, ins):
    x, keys, values, default = ins
    if keys.dtype != x.dtype:
        _fail(node, f"keys {keys.name!r} are {keys.dtype}, x is {x.dtype}; they must be of one type")
    if keys.shape is None or values.shape is None or len(keys.shape) != 1 or len(values.shape) != 1:
        _fail(node, "keys and values must be 1-D")
    k, v = keys.shape[0], values.shape[0]
    if isinstance(k, int) and isinstance(v, int) and k != v:
        _fail(node, f"{k} keys but {v} values")
    if default.dtype != values.dtype or default.shape not in ((), (1,)):
        _fail(node, f"default {default.name!r} must be one {values.dtype} value, got {default.type_str()}")
    return [(x.shape, values.dtype)]


_TREE_ATTRS = {
    "tree_roots": REQUIRED, "nodes_featureids": REQUIRED, "nodes_modes": REQUIRED,
    "nodes_truenodeids": REQUIRED, "nodes_trueleafs": REQUIRED,
    "nodes_falsenodeids": REQUIRED, "nodes_falseleafs": REQUIRED,
    "nodes_missing_value_tracks_true": None, "leaf_targetids": REQUIRED,
    "n_targets": REQUIRED, "aggregate_function": "sum", "post_transform": "none",
}


@op("tree_ensemble", ["x", "nodes_splits", "leaf_weights", "membership_values?"], attrs=_TREE_ATTRS,
    groups=_ML)
def _tree_ensemble(node, a, ins):
    x, splits, weights = ins[0], ins[1], ins[2]
    members = ins[3] if len(ins) > 3 else None
    if x.dtype not in FLOAT_TYPES or x.shape is None or len(x.shape) != 2:
        _fail(node, f"x must be a 2-D float tensor (N, features), got {x.type_str()}")
    if a["aggregate_function"] not in AGGREGATES:
        _fail(node, f"aggregate_function {a['aggregate_function']!r}; expected one of {', '.join(AGGREGATES)}")
    if a["post_transform"] not in POST_TRANSFORMS:
        _fail(node, f"post_transform {a['post_transform']!r}; expected one of {', '.join(POST_TRANSFORMS)}")
    for role, v in (("nodes_splits", splits), ("leaf_weights", weights), ("membership_values", members)):
        if v is not None and (v.dtype not in FLOAT_TYPES or v.shape is None or len(v.shape) != 1):
            _fail(node, f"{role} must be a 1-D float tensor, got {v.type_str()}")
    n_nodes, n_leaves = len(a["nodes_featureids"]), len(a["leaf_targetids"])
    for k in ("nodes_modes", "nodes_truenodeids", "nodes_trueleafs", "nodes_falsenodeids", "nodes_falseleafs"):
        if len(a[k]) != n_nodes:
            _fail(node, f"{k} has {len(a[k])} entries, nodes_featureids {n_nodes}")
    if a["nodes_missing_value_tracks_true"] is not None and len(a["nodes_missing_value_tracks_true"]) != n_nodes:
        _fail(node, f"nodes_missing_value_tracks_true has {len(a['nodes_missing_value_tracks_true'])} "
                    f"entries, nodes_featureids {n_nodes}")
    if splits.shape[0] not in (n_nodes, UNKNOWN) or weights.shape[0] not in (n_leaves, UNKNOWN):
        _fail(node, f"nodes_splits has {splits.shape[0]} entries for {n_nodes} nodes and leaf_weights "
                    f"{weights.shape[0]} for {n_leaves} leaves")
    n_targets = a["n_targets"]
    if not isinstance(n_targets, int) or n_targets < 1:
        _fail(node, f"n_targets {n_targets!r} must be a positive integer")
    if any(not 0 <= t < n_targets for t in a["leaf_targetids"]):
        _fail(node, f"leaf_targetids must lie in [0, {n_targets})")
    if any(not 0 <= m < len(MODES) for m in a["nodes_modes"]):
        _fail(node, f"nodes_modes must lie in [0, {len(MODES)}) ({', '.join(MODES)})")
    for ids, leafs, what in (("nodes_truenodeids", "nodes_trueleafs", "true"),
                             ("nodes_falsenodeids", "nodes_falseleafs", "false")):
        for i, leaf in zip(a[ids], a[leafs]):
            if not 0 <= i < (n_leaves if leaf else n_nodes):
                _fail(node, f"a {what} branch points to {'leaf' if leaf else 'node'} {i}, out of range")
    if any(not 0 <= r < n_nodes for r in a["tree_roots"]):
        _fail(node, f"tree_roots must index the {n_nodes} nodes")
    if 6 in a["nodes_modes"] and members is None:
        _fail(node, "set-membership nodes (mode 6) need membership_values")
    return [((x.shape[0], n_targets), x.dtype)]
