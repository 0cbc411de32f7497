"""com.microsoft Attention, QAttention, MultiHeadAttention and RotaryEmbedding against ONNX
Runtime on the reference and cpu backends, fresh random inputs each run."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import nonzero_normal
from contrib_util import check, check_like, node_model, quantized, scale

B, S, N, H = 2, 5, 2, 4
D = N * H


def _mask(rng, kind, total=S, sq=S):
    lens = np.array([total, max(1, total - 2)], np.int32)
    if kind == "lengths":
        return lens
    if kind == "left":  # end positions, then start positions
        return np.concatenate([np.array([total, total], np.int32), np.array([0, 2], np.int32)])
    raw = (np.arange(total)[None, :] < lens[:, None]).astype(np.int32)
    if kind == "raw":
        return raw
    return np.broadcast_to(raw[:, None, :], (B, sq, total)).copy()  # "3d"


@pytest.mark.parametrize("mask, unidirectional", [(m, u) for m in (None, "lengths", "left", "raw", "3d") for u in (0, 1)
                                                  # (left padding + causal leaves a query before the start
                                                  # with only masked keys: ORT's float32 rounding of
                                                  # score - 10000 decides those rows)
                                                  if (m, u) != ("left", 1)])
def test_attention(rng, tmp_path, mask, unidirectional):
    x = nonzero_normal(rng, (B, S, 6))
    w, b = nonzero_normal(rng, (6, 3 * D)) * 0.5, nonzero_normal(rng, (3 * D,)) * 0.1
    ins = [("x", x), ("w", w), ("b", b)] + ([("m", _mask(rng, mask))] if mask else [])
    m = node_model("Attention", ins, attrs={"num_heads": N, "unidirectional": unidirectional}, consts={"w", "b"})
    check(m, {"x": x, **({"m": ins[3][1]} if mask else {})}, tmp_path, rtol=1e-4, atol=1e-5)


def test_attention_past_present(rng, tmp_path):
    p = 3
    x = nonzero_normal(rng, (B, S, 6))
    w, b = nonzero_normal(rng, (6, 3 * D)) * 0.5, nonzero_normal(rng, (3 * D,)) * 0.1
    past = nonzero_normal(rng, (2, B, N, p, H))
    msk = _mask(rng, "raw", p + S)
    m = node_model("Attention", [("x", x), ("w", w), ("b", b), ("m", msk), ("past", past)], n_out=2,
                   attrs={"num_heads": N, "unidirectional": 1, "scale": 0.3}, consts={"w", "b"})
    check(m, {"x": x, "m": msk, "past": past}, tmp_path, rtol=1e-4, atol=1e-5)


def test_attention_bias_input(rng, tmp_path):
    # (ONNX Runtime takes attention_bias or past, not both)
    x = nonzero_normal(rng, (B, S, 6))
    w, b = nonzero_normal(rng, (6, 3 * D)) * 0.5, nonzero_normal(rng, (3 * D,)) * 0.1
    ab = nonzero_normal(rng, (1, N, S, S))
    m = node_model("Attention", [("x", x), ("w", w), ("b", b), ("m", _mask(rng, "lengths")), None, ("ab", ab)],
                   attrs={"num_heads": N}, consts={"w", "b"})
    check(m, {"x": x, "m": _mask(rng, "lengths"), "ab": ab}, tmp_path, rtol=1e-4, atol=1e-5)


def test_attention_qkv_hidden_sizes(rng, tmp_path):
    x = nonzero_normal(rng, (B, S, 6))
    sizes = [8, 8, 12]
    w, b = nonzero_normal(rng, (6, sum(sizes))) * 0.5, nonzero_normal(rng, (sum(sizes),)) * 0.1
    m = node_model("Attention", [("x", x), ("w", w), ("b", b)], attrs={"num_heads": N, "qkv_hidden_sizes": sizes,
                                                                      "mask_filter_value": -1000.0}, consts={"w", "b"})
    check(m, {"x": x}, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("w_dtype, per_column", [(np.int8, False), (np.uint8, False), (np.int8, True)])
def test_qattention(rng, tmp_path, w_dtype, per_column):
    x = quantized(rng, (B, S, 16))
    w = quantized(rng, (16, 3 * D), w_dtype)
    ws = rng.uniform(0.002, 0.01, 3 * D if per_column else ()).astype(np.float32)
    wz = np.zeros(3 * D if per_column else (), w_dtype) if w_dtype is np.int8 else np.array(128, np.uint8)
    ins = [("x", x), ("w", w), ("b", nonzero_normal(rng, (3 * D,)) * 0.1), ("xs", scale(rng, 0.01, 0.02)),
           ("ws", ws), ("m", _mask(rng, "lengths")), ("xz", np.array(rng.integers(100, 150), np.uint8)), ("wz", wz)]
    m = node_model("QAttention", ins, attrs={"num_heads": N}, consts={"w", "b", "ws", "wz"})
    check(m, {"x": x, "xs": ins[3][1], "m": ins[5][1], "xz": ins[6][1]}, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("form", ["separate", "bnsh", "packed_kv", "packed_qkv"])
def test_multi_head_attention_forms(rng, tmp_path, form):
    # ONNX Runtime's CPU kernel has no packed forms: for those the oracle is the same node
    # with Q, K, V unpacked (and the bias split the same way)
    L = 6 if form != "packed_qkv" else S
    q = nonzero_normal(rng, (B, S, D))
    bias = nonzero_normal(rng, (3 * D,)) * 0.1
    oracle = None
    if form == "separate":
        k, v = nonzero_normal(rng, (B, L, D)), nonzero_normal(rng, (B, L, D))
        ins, feeds = [("q", q), ("k", k), ("v", v), ("bias", bias)], {"q": q, "k": k, "v": v}
    elif form == "bnsh":
        k, v = nonzero_normal(rng, (B, N, L, H)), nonzero_normal(rng, (B, N, L, H))
        ins, feeds = [("q", q), ("k", k), ("v", v)], {"q": q, "k": k, "v": v}
    elif form == "packed_kv":
        kv = nonzero_normal(rng, (B, L, N, 2, H))
        ins, feeds = [("q", q), ("kv", kv), None, ("bias", bias)], {"q": q, "kv": kv}
        k, v = kv[:, :, :, 0].reshape(B, L, D), kv[:, :, :, 1].reshape(B, L, D)
        oracle = node_model("MultiHeadAttention", [("q", q), ("k", k), ("v", v), ("bias", bias)],
                            attrs={"num_heads": N}, consts={"bias", "k", "v"})
    else:
        qkv = nonzero_normal(rng, (B, S, N, 3, H))
        ins, feeds = [("qkv", qkv), None, None, ("bias", bias)], {"qkv": qkv}
        qs, ks, vs = (qkv[:, :, :, i].reshape(B, S, D) for i in range(3))
        oracle = node_model("MultiHeadAttention", [("qkv", qs), ("k", ks), ("v", vs), ("bias", bias)],
                            attrs={"num_heads": N}, consts={"bias", "k", "v"})
    m = node_model("MultiHeadAttention", ins, attrs={"num_heads": N}, consts={"bias"})
    if oracle is None:
        check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)
    else:
        import npurun
        from contrib_util import typed
        oracle_feeds = {k_: v_ for k_, v_ in feeds.items() if k_ in ("q", "qkv")}
        oracle_feeds = {"q": q} if form == "packed_kv" else {"qkv": qs}
        import onnx
        onnx.save(oracle, tmp_path / "o.onnx")
        check_like(m, typed(oracle, npurun.load(tmp_path / "o.onnx")), feeds if False else feeds, tmp_path,
                   rtol=1e-4, atol=1e-5, oracle_feeds=oracle_feeds)


@pytest.mark.parametrize("mask", [None, "lengths", "raw"])
def test_multi_head_attention_cache_and_masks(rng, tmp_path, mask):
    p, L = 3, S
    q, k, v = nonzero_normal(rng, (B, S, D)), nonzero_normal(rng, (B, L, D)), nonzero_normal(rng, (B, L, D))
    pk, pv = nonzero_normal(rng, (B, N, p, H)), nonzero_normal(rng, (B, N, p, H))
    ab = nonzero_normal(rng, (B, 1, S, p + L))
    ins = [("q", q), ("k", k), ("v", v), ("bias", nonzero_normal(rng, (3 * D,)) * 0.1),
           ("m", _mask(rng, mask, p + L)) if mask else None, ("ab", ab), ("pk", pk), ("pv", pv)]
    feeds = {"q": q, "k": k, "v": v, "ab": ab, "pk": pk, "pv": pv, **({"m": ins[4][1]} if mask else {})}
    m = node_model("MultiHeadAttention", ins, n_out=3, attrs={"num_heads": N, "unidirectional": 1, "scale": 0.4},
                   consts={"bias"})
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("layout, interleaved, rot, pos", [
    ("bsd", 0, 0, "full"), ("bsd", 1, 0, "full"), ("bnsh", 0, 0, "full"), ("bsd", 0, 2, "offset"),
    ("bnsh", 1, 2, "offset"),
])
def test_rotary_embedding(rng, tmp_path, layout, interleaved, rot, pos):
    maxpos = 16
    x = nonzero_normal(rng, (B, S, D) if layout == "bsd" else (B, N, S, H))
    half = (rot or H) // 2
    theta = rng.uniform(0, 3, (maxpos, half)).astype(np.float32)
    pids = rng.integers(0, maxpos, (B, S)).astype(np.int64) if pos == "full" else np.array([3], np.int64)
    attrs = {"interleaved": interleaved}
    if layout == "bsd":
        attrs["num_heads"] = N
    if rot:
        attrs["rotary_embedding_dim"] = rot
        attrs["num_heads"] = N
    m = node_model("RotaryEmbedding", [("x", x), ("p", pids), ("cos", np.cos(theta)), ("sin", np.sin(theta))],
                   attrs=attrs, consts={"cos", "sin"})
    check(m, {"x": x, "p": pids}, tmp_path, rtol=1e-5, atol=1e-6)


def test_multi_head_attention_present_and_qk_outputs(rng, tmp_path):
    q, k, v = (nonzero_normal(rng, (B, S, D)) for _ in range(3))
    m = node_model("MultiHeadAttention", [("q", q), ("k", k), ("v", v)], out_names=["y", "pk", "pv", "qk"],
                   attrs={"num_heads": N, "scale": 0.7})
    check(m, {"q": q, "k": k, "v": v}, tmp_path, rtol=1e-4, atol=1e-5)
