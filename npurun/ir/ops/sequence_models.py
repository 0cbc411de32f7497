"""Transformer and recurrent ops: attention in its forms, rotary embeddings, RMS normalization,
linear attention, stateful causal convolution, KV-cache scatter, and the RNN/GRU/LSTM cells.

Optional outputs (present key/value, recurrent states, ...) are trailing roles ending in `?`;
a node lists as many outputs as it uses, and inference returns that many.
"""
from __future__ import annotations

from ..shapes import UNKNOWN, affine, dim_add, dim_mul, numel
from . import REQUIRED, _axis, _fail, _same, op


def _first(node, outs):
    """The first len(node.outputs) of an op's full output list."""
    return outs[:len(node.outputs)]


def _split_heads(node, shape, heads, what):
    """(B, S, H*D) with H heads -> (B, H, S, D); a 4-D shape is already split."""
    if len(shape) == 4:
        return tuple(shape)
    if len(shape) != 3:
        _fail(node, f"{what} must be 3-D (B, S, H*D) or 4-D (B, H, S, D), got {list(shape)}")
    if not heads:
        _fail(node, f"{what} is 3-D, so the q_num_heads/kv_num_heads attributes are required")
    hidden = shape[2]
    if isinstance(hidden, int) and hidden % heads:
        _fail(node, f"{what} hidden size {hidden} is not a multiple of {heads} heads")
    return (shape[0], heads, shape[1], affine(hidden, div=heads))


def _attention_macs(a, ins, outs):
    # Q @ K^T is numel(q) * T and P @ V numel(y) * T, T keys in all (past + new).
    k, past = ins[1], ins[4] if len(ins) > 4 else None
    total = (k[2] if len(k) == 4 else k[1]) + (past[2] if past else 0)
    return (numel(ins[0]) + numel(outs[0])) * total


@op("attention", ["q", "k", "v", "attn_mask?", "past_key?", "past_value?", "nonpad_kv_seqlen?"],
    ["y", "present_key?", "present_value?", "qk_matmul_output?"],
    attrs={"is_causal": 0, "q_num_heads": 0, "kv_num_heads": 0, "qk_matmul_output_mode": 0,
           "scale": None, "softcap": 0.0, "softmax_precision": None,
           "left_window_size": -1, "right_window_size": -1},
    groups={"attention", "mac"}, macs=_attention_macs)
def _attention(node, a, ins):
    q, k, v, past = ins[0], ins[1], ins[2], ins[4] if len(ins) > 4 else None
    if len(q.shape) != len(k.shape) or len(q.shape) != len(v.shape):
        _fail(node, f"q, k, v ranks differ: {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    b, hq, sq, _ = _split_heads(node, q.shape, a["q_num_heads"], "q")
    _, hkv, skv, dk = _split_heads(node, k.shape, a["kv_num_heads"], "k")
    _, _, _, dv = _split_heads(node, v.shape, a["kv_num_heads"], "v")
    if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv:
        _fail(node, f"{hq} query heads are not a multiple of {hkv} key/value heads")
    total = dim_add(past.shape[2], skv) if past is not None else skv
    y = (b, hq, sq, dv) if len(q.shape) == 4 else (b, sq, dim_mul(hq, dv))
    return _first(node, [(y, q.dtype), ((b, hkv, total, dk), k.dtype), ((b, hkv, total, dv), v.dtype),
                         ((b, hq, sq, total), q.dtype)])


@op("rotary_embedding", ["x", "cos_cache", "sin_cache", "position_ids?"],
    attrs={"interleaved": 0, "num_heads": 0, "rotary_embedding_dim": 0}, groups={"attention"})
def _rotary(node, a, ins):
    if len(ins[0].shape) not in (3, 4):
        _fail(node, f"input must be 3-D or 4-D, got {list(ins[0].shape)}")
    if len(ins[0].shape) == 3 and not a["num_heads"]:
        _fail(node, "a 3-D input needs the num_heads attribute")
    return _same(node, a, ins)


@op("rms_normalization", ["x", "scale"], attrs={"axis": -1, "epsilon": 1e-5, "stash_type": "f32"},
    groups={"norm"})
def _rms(node, a, ins):
    _axis(a["axis"], len(ins[0].shape), node)
    return _same(node, a, ins)


@op("linear_attention", ["query", "key", "value", "past_state?", "decay?", "beta?"],
    ["output", "present_state?"],
    attrs={"q_num_heads": REQUIRED, "kv_num_heads": REQUIRED, "scale": 0.0,
           "update_rule": "gated_delta", "chunk_size": 0},
    groups={"attention"})
def _linear_attention(node, a, ins):
    q, k, v = ins[0], ins[1], ins[2]
    if any(len(t.shape) != 3 for t in (q, k, v)):
        _fail(node, "query, key and value must be 3-D (B, T, H*D)")
    hq, hkv = a["q_num_heads"], a["kv_num_heads"]
    if hkv <= 0 or hq % hkv:
        _fail(node, f"q_num_heads {hq} must be a positive multiple of kv_num_heads {hkv}")
    if a["update_rule"] not in ("linear", "gated", "delta", "gated_delta"):
        _fail(node, f"unknown update_rule {a['update_rule']!r}")
    dk, dv = affine(k.shape[2], div=hkv), affine(v.shape[2], div=hkv)
    state_dtype = ins[3].dtype if len(ins) > 3 and ins[3] is not None else q.dtype
    return _first(node, [((q.shape[0], q.shape[1], dim_mul(hq, dv)), q.dtype),
                         ((q.shape[0], hkv, dk, dv), state_dtype)])


@op("causal_conv_with_state", ["x", "w", "b?", "past_state?"], ["y", "present_state?"],
    attrs={"activation": "none"}, groups={"conv", "mac"},
    macs=lambda a, ins, outs: numel(outs[0]) * ins[1][-1])
def _causal_conv(node, a, ins):
    x, w = ins[0], ins[1]
    if len(x.shape) != 3 or len(w.shape) != 3:
        _fail(node, f"input and weight must be 3-D, got {list(x.shape)} and {list(w.shape)}")
    if a["activation"] not in ("none", "silu", "swish"):
        _fail(node, f"unknown activation {a['activation']!r}; expected silu, swish or none")
    k = w.shape[2]
    return _first(node, [(x.shape, x.dtype),
                         ((x.shape[0], x.shape[1], affine(k, add=-1) if k != UNKNOWN else UNKNOWN), x.dtype)])


@op("tensor_scatter", ["past_cache", "update", "write_indices?"],
    attrs={"axis": -2, "mode": "linear"}, groups={"data_movement"})
def _tensor_scatter(node, a, ins):
    rank = len(ins[0].shape)
    if _axis(a["axis"], rank, node) == 0:
        _fail(node, "axis cannot be the batch dimension 0")
    if a["mode"] not in ("linear", "circular"):
        _fail(node, f"unknown mode {a['mode']!r}; expected linear or circular")
    return _same(node, a, ins)


# ------------------------------------------------------------------------- recurrent cells

_RNN_ATTRS = {"hidden_size": None, "direction": "forward", "activations": None,
              "activation_alpha": None, "activation_beta": None, "clip": None, "layout": 0}


def _recurrent(gates, n_states):
    """Inference for RNN (1 gate), GRU (3) and LSTM (4): x is (S, B, I), or (B, S, I) with
    layout=1; y is (S, D, B, H) or (B, S, D, H); each state is (D, B, H) or (B, D, H)."""
    def infer(node, a, ins):
        # x and w are 3-D by definition: one of unknown rank gives results of known rank (an
        # exporter's If on x's rank often leaves it unknown); the kernel checks it at run time.
        xs = (UNKNOWN,) * 3 if ins[0].shape is None else ins[0].shape
        ws = (UNKNOWN,) * 3 if ins[1].shape is None else ins[1].shape
        if len(xs) != 3 or len(ws) != 3:
            _fail(node, f"x and w must be 3-D, got {list(xs)} and {list(ws)}")
        x, w = ins[0], ins[1]
        if a["direction"] not in ("forward", "reverse", "bidirectional"):
            _fail(node, f"unknown direction {a['direction']!r}")
        d = 2 if a["direction"] == "bidirectional" else 1
        h = a["hidden_size"] or affine(ws[1], div=gates)
        s, b = (xs[1], xs[0]) if a["layout"] else (xs[0], xs[1])
        y = (b, s, d, h) if a["layout"] else (s, d, b, h)
        state = (b, d, h) if a["layout"] else (d, b, h)
        return _first(node, [(y, x.dtype)] + [(state, x.dtype)] * n_states)
    return infer


def _recurrent_macs(a, ins, outs):
    # Each of S*B steps multiplies x (I) and h (H) into G*H pre-activations, per direction:
    # w is (D, G*H, I), r is (D, G*H, H).
    x, w, r = ins[0], ins[1], ins[2]
    return numel(x) // max(x[2], 1) * w[0] * w[1] * (w[2] + r[2])


op("rnn", ["x", "w", "r", "b?", "sequence_lens?", "initial_h?"], ["y", "y_h?"],
   attrs=_RNN_ATTRS, groups={"recurrent", "mac"}, macs=_recurrent_macs, any_rank=True)(_recurrent(1, 1))
op("gru", ["x", "w", "r", "b?", "sequence_lens?", "initial_h?"], ["y", "y_h?"],
   attrs={**_RNN_ATTRS, "linear_before_reset": 0}, groups={"recurrent", "mac"},
   macs=_recurrent_macs, any_rank=True)(_recurrent(3, 1))
op("lstm", ["x", "w", "r", "b?", "sequence_lens?", "initial_h?", "initial_c?", "p?"],
   ["y", "y_h?", "y_c?"], attrs={**_RNN_ATTRS, "input_forget": 0}, groups={"recurrent", "mac"},
   macs=_recurrent_macs, any_rank=True)(_recurrent(4, 2))


# ------------------------------------------------------------------ attention with subgraphs

@op("flex_attention", ["q", "k", "v"], attrs={"scale": None, "softmax_precision": "f32"},
    regions=("score_mod", "prob_mod"), groups={"attention", "mac"}, macs=_attention_macs)
def _flex_attention(node, a, ins):
    # q (B, Hq, L, D), k (B, Hkv, S, D), v (B, Hkv, S, Dv) -> y (B, Hq, L, Dv); the regions
    # map the (B, Hq, L, S) scores and probabilities to new ones of the same shape.
    q, k, v = ins
    if any(len(t.shape) != 4 for t in ins):
        _fail(node, f"q, k, v must be 4-D, got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    hq, hkv = q.shape[1], k.shape[1]
    if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv:
        _fail(node, f"{hq} query heads are not a multiple of {hkv} key/value heads")
    for name, region in node.regions.items():
        if len(region.inputs) != 1 or len(region.outputs) != 1:
            _fail(node, f"region {name} must take one tensor and produce one")
    return [((q.shape[0], hq, q.shape[2], v.shape[3]), q.dtype)]
