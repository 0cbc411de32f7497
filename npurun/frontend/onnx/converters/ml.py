"""ai.onnx.ml ONNX ops: ArrayFeatureExtractor, Binarizer, LabelEncoder, TreeEnsemble.

Tables given as attributes (keys, values, splits, leaf weights) become constant operands of
the IR node, in their own element type (ir/ops/ml.py says why).
"""
from __future__ import annotations

import numpy as np

from ....ir.ops.ml import AGGREGATES, POST_TRANSFORMS
from ..context import ConvertError, Ctx
from . import converter

ML = "ai.onnx.ml"


@converter("ArrayFeatureExtractor", domain=ML)
def ArrayFeatureExtractor(ctx: Ctx):
    ctx.emit("array_feature_extractor", ctx.inputs()[:2], [ctx.output(0)])


@converter("Binarizer", domain=ML)
def Binarizer(ctx: Ctx):
    ctx.emit("binarizer", [ctx.input(0)], [ctx.output(0)], threshold=float(ctx.attrs.get("threshold", 0.0)))


def _strings(items) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = [s.decode() if isinstance(s, bytes) else str(s) for s in items]
    return out


# The list attributes of LabelEncoder (opset 2 on) and their element types.
_LISTS = {"floats": np.float32, "int64s": np.int64, "strings": None}
_DEFAULTS = {np.dtype(np.float32): -0.0, np.dtype(np.int64): -1, np.dtype(object): "_Unused"}


def _table(ctx: Ctx, side: str) -> np.ndarray:
    """keys_* or values_*: the one given, as an array of its type."""
    given = [k for k in (*(f"{side}_{t}" for t in _LISTS), f"{side}_tensor") if k in ctx.attrs]
    if len(given) != 1:
        raise ConvertError(f"LabelEncoder needs exactly one {side}_* attribute, got {given or 'none'}")
    k = given[0]
    v = ctx.attrs[k]
    if k.endswith("_tensor"):
        return _strings(v.reshape(-1).tolist()) if v.dtype.kind in "OSU" else np.asarray(v).reshape(-1)
    t = _LISTS[k.split("_", 1)[1]]
    return _strings(v) if t is None else np.asarray(v, dtype=t)


@converter("LabelEncoder", since=2, domain=ML)
def LabelEncoder(ctx: Ctx):
    keys, values = _table(ctx, "keys"), _table(ctx, "values")
    if len(keys) != len(values):
        raise ConvertError(f"{len(keys)} keys but {len(values)} values")
    if "default_tensor" in ctx.attrs:
        d = ctx.attrs["default_tensor"]
        default = _strings(d.reshape(-1).tolist()) if d.dtype.kind in "OSU" else np.asarray(d).reshape(-1)
    else:
        attr = {np.dtype(np.float32): "default_float", np.dtype(np.int64): "default_int64",
                np.dtype(object): "default_string"}.get(values.dtype)
        if attr is None:  # values_tensor of another type without default_tensor
            fallback = "_Unused" if values.dtype == object else (-0.0 if values.dtype.kind == "f" else -1)
        else:
            fallback = ctx.attrs.get(attr, _DEFAULTS[values.dtype])
        default = _strings([fallback]) if values.dtype == object else np.array([fallback], dtype=values.dtype)
    if default.dtype != values.dtype:
        raise ConvertError(f"default_tensor is {default.dtype}, values are {values.dtype}")
    ctx.emit("label_encoder", [ctx.input(0), ctx.const(keys, "keys"), ctx.const(values, "values"),
                               ctx.const(default.reshape(()), "default")], [ctx.output(0)])


@converter("LabelEncoder", domain=ML)
def LabelEncoder_1(ctx: Ctx):
    """Opset 1: strings -> their index in classes_strings (default_int64), or int64 indices ->
    the class string (default_string), by the input's type."""
    classes = _strings(ctx.attrs.get("classes_strings", []))
    index = np.arange(len(classes), dtype=np.int64)
    if ctx.value(ctx.input(0)).dtype == "str":
        keys, values = classes, index
        default = np.array(ctx.attrs.get("default_int64", -1), dtype=np.int64)
    else:
        keys, values = index, classes
        default = _strings([ctx.attrs.get("default_string", "_Unused")]).reshape(())
    ctx.emit("label_encoder", [ctx.input(0), ctx.const(keys, "keys"), ctx.const(values, "values"),
                               ctx.const(default, "default")], [ctx.output(0)])


def _ints(ctx: Ctx, name: str):
    v = ctx.attrs.get(name)
    return None if v is None else [int(i) for i in np.asarray(v).reshape(-1)]


@converter("TreeEnsemble", since=5, domain=ML)
def TreeEnsemble(ctx: Ctx):
    a = ctx.attrs
    agg, post = a.get("aggregate_function", 1), a.get("post_transform", 0)
    if not 0 <= agg < len(AGGREGATES) or not 0 <= post < len(POST_TRANSFORMS):
        raise ConvertError(f"aggregate_function {agg} / post_transform {post} is not one ONNX defines")
    targets = _ints(ctx, "leaf_targetids")
    ins = [ctx.input(0), ctx.const(np.asarray(a["nodes_splits"]).reshape(-1), "nodes_splits"),
           ctx.const(np.asarray(a["leaf_weights"]).reshape(-1), "leaf_weights")]
    if "membership_values" in a:
        ins.append(ctx.const(np.asarray(a["membership_values"]).reshape(-1), "membership_values"))
    ctx.emit("tree_ensemble", ins, [ctx.output(0)],
             tree_roots=_ints(ctx, "tree_roots"), nodes_featureids=_ints(ctx, "nodes_featureids"),
             nodes_modes=_ints(ctx, "nodes_modes"),
             nodes_truenodeids=_ints(ctx, "nodes_truenodeids"), nodes_trueleafs=_ints(ctx, "nodes_trueleafs"),
             nodes_falsenodeids=_ints(ctx, "nodes_falsenodeids"), nodes_falseleafs=_ints(ctx, "nodes_falseleafs"),
             nodes_missing_value_tracks_true=_ints(ctx, "nodes_missing_value_tracks_true"),
             leaf_targetids=targets, n_targets=int(a.get("n_targets", max(targets, default=-1) + 1)),
             aggregate_function=AGGREGATES[agg], post_transform=POST_TRANSFORMS[post])
