"""Reference kernels of the ai.onnx.ml ops (ir/ops/ml.py)."""
from __future__ import annotations

import math

import numpy as np

from ....ir.ops.ml import MODES
from . import _like, kernel


@kernel("array_feature_extractor")
def array_feature_extractor(x, indices):
    # The indices select along the last axis; a 1-D x counts as one row (as ONNX Runtime does).
    idx = indices.reshape(-1).astype(np.int64)
    size = x.shape[-1]
    if np.any((idx < -size) | (idx >= size)):
        raise ValueError(f"indices {idx.tolist()} out of range for a last axis of {size}")
    y = x[..., idx]
    return y.reshape(1, -1) if x.ndim == 1 else y


@kernel("binarizer")
def binarizer(x, *, threshold):
    return _like(x, x > threshold)


@kernel("label_encoder")
def label_encoder(x, keys, values, default):
    table = {}
    nan_value = None
    for k, v in zip(keys.tolist(), values.tolist()):
        if isinstance(k, float) and math.isnan(k):
            nan_value = v  # a NaN key matches every NaN input, whatever its bits
        else:
            table.setdefault(k, v)
    fallback = default.reshape(-1)[0].item() if default.dtype != object else default.reshape(-1)[0]
    flat = x.reshape(-1).tolist()
    out = [nan_value if isinstance(e, float) and math.isnan(e) and nan_value is not None
           else table.get(e, fallback) for e in flat]
    y = np.empty(len(out), dtype=values.dtype)
    y[:] = out
    return y.reshape(x.shape)


def _route(x, root, a, splits, sets):
    """The leaf each row of x reaches from node `root`: x is (N, F); returns (N,) leaf ids."""
    feat = np.asarray(a["nodes_featureids"], np.int64)
    mode = np.asarray(a["nodes_modes"], np.int64)
    t_id, t_leaf = np.asarray(a["nodes_truenodeids"], np.int64), np.asarray(a["nodes_trueleafs"], bool)
    f_id, f_leaf = np.asarray(a["nodes_falsenodeids"], np.int64), np.asarray(a["nodes_falseleafs"], bool)
    nan_true = np.asarray(a["nodes_missing_value_tracks_true"] or [0] * len(feat), bool)
    rows = np.arange(x.shape[0])
    node = np.full(x.shape[0], root, np.int64)
    leaf = np.full(x.shape[0], -1, np.int64)
    active = np.ones(x.shape[0], bool)
    for _ in range(len(feat) + 1):  # a path visits each node at most once
        if not active.any():
            return leaf
        r, n = rows[active], node[active]
        v, s, m = x[r, feat[n]], splits[n], mode[n]
        go = np.select([m == 0, m == 1, m == 2, m == 3, m == 4, m == 5],
                       [v <= s, v < s, v >= s, v > s, v == s, v != s], default=False)
        for k in np.flatnonzero(m == 6):  # set membership
            go[k] = v[k] in sets[n[k]]
        go |= nan_true[n] & np.isnan(v)
        nxt, is_leaf = np.where(go, t_id[n], f_id[n]), np.where(go, t_leaf[n], f_leaf[n])
        leaf[r[is_leaf]] = nxt[is_leaf]
        node[r] = nxt
        active[r[is_leaf]] = False
    raise ValueError(f"the tree at node {root} has a cycle")


def _post_transform(s, how):
    """Per row of scores s (N, targets), in float64."""
    if how == "softmax":
        e = np.exp(s - s.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)
    if how == "softmax_zero":  # as softmax, but a zero score stays zero
        e = np.where(s != 0, np.exp(s - s.max(axis=1, keepdims=True)), 0.0)
        total = e.sum(axis=1, keepdims=True)
        return e / np.where(total > 0, total, 1.0)
    if how == "logistic":
        return 1.0 / (1.0 + np.exp(-s))
    if how == "probit":
        from scipy.special import erfinv
        return math.sqrt(2) * erfinv(2 * s - 1)
    return s


@kernel("tree_ensemble")
def tree_ensemble(x, nodes_splits, leaf_weights, membership_values=None, **a):
    xs, splits = x.astype(np.float64), nodes_splits.astype(np.float64)
    weights = leaf_weights.astype(np.float64)
    targets = np.asarray(a["leaf_targetids"], np.int64)
    # The members of each mode-6 node, in node order, each set ended by NaN.
    sets, members = {}, (membership_values.astype(np.float64).tolist() if membership_values is not None else [])
    for n in [i for i, m in enumerate(a["nodes_modes"]) if MODES[m] == "member"]:
        end = next((j for j, v in enumerate(members) if math.isnan(v)), len(members))
        sets[n], members = set(members[:end]), members[end + 1:]
    n_rows, n_targets = x.shape[0], a["n_targets"]
    agg = a["aggregate_function"]
    score = np.zeros((n_rows, n_targets)) if agg in ("sum", "average") else \
        np.full((n_rows, n_targets), np.inf if agg == "min" else -np.inf)
    rows = np.arange(n_rows)
    reached = np.zeros((n_rows, n_targets), bool)
    for root in a["tree_roots"]:
        leaf = _route(xs, root, a, splits, sets)
        t, w = targets[leaf], weights[leaf]
        reached[rows, t] = True
        if agg in ("sum", "average"):
            np.add.at(score, (rows, t), w)
        elif agg == "min":
            np.minimum.at(score, (rows, t), w)
        else:
            np.maximum.at(score, (rows, t), w)
    if agg == "average":
        score /= len(a["tree_roots"])
    elif agg in ("min", "max"):
        score[~reached] = 0.0  # a target no tree reached scores 0 (ONNX Runtime's choice)
    return _post_transform(score, a["post_transform"]).astype(x.dtype)
