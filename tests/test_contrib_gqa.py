"""com.microsoft GroupQueryAttention (the GenAI model builder's attention) against ONNX Runtime
on the reference and cpu backends: prompt and decode steps, rows of different lengths, packed
QKV, rotary embeddings, sliding window, softcap and softmax sinks."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import nonzero_normal
from contrib_util import check, node_model

NQ, NKV, H = 4, 2, 32  # (ORT wants head sizes, and half rotary dims, multiples of 16)


def _caches(rng, dim=H, maxpos=32):
    theta = rng.uniform(0, 3, (maxpos, dim // 2)).astype(np.float32)
    return np.cos(theta), np.sin(theta)


def _case(rng, b, s, past_len, lens, packed=False, rotary=None, attrs=None, extra=()):
    """Inputs and feeds of one GQA node: `lens` are the rows' valid token counts after the step."""
    q = nonzero_normal(rng, (b, s, NQ * H))
    k, v = nonzero_normal(rng, (b, s, NKV * H)), nonzero_normal(rng, (b, s, NKV * H))
    seqlens = np.array(lens, np.int32) - 1
    total = np.array([max(lens)], np.int32)
    ins, feeds = [], {}
    if packed:
        qkv = np.concatenate([q, k, v], axis=2)
        ins += [("qkv", qkv), None, None]
        feeds["qkv"] = qkv
    else:
        ins += [("q", q), ("k", k), ("v", v)]
        feeds.update(q=q, k=k, v=v)
    if past_len:
        pk, pv = nonzero_normal(rng, (b, NKV, past_len, H)), nonzero_normal(rng, (b, NKV, past_len, H))
        for r, n in enumerate(lens):  # a cache buffer holds zeros past each row's tokens, as a
            pk[r, :, n - s:] = pv[r, :, n - s:] = 0  # generator keeps it (in place: present is past)
        ins += [("pk", pk), ("pv", pv)]
        feeds.update(pk=pk, pv=pv)
    else:
        ins += [None, None]
    ins += [("seqlens", seqlens), ("total", total)]
    feeds.update(seqlens=seqlens, total=total)
    if rotary is not None:
        cos, sin = _caches(rng, rotary)
        ins += [("cos", cos), ("sin", sin)]
    ins += list(extra)
    a = {"num_heads": NQ, "kv_num_heads": NKV, **(attrs or {})}
    if rotary is not None:
        a["do_rotary"] = 1
    return node_model("GroupQueryAttention", ins, n_out=3, attrs=a, consts={"cos", "sin", "sink"}), feeds


def test_prompt(rng, tmp_path):
    m, feeds = _case(rng, 2, 6, 0, [6, 6])
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_decode_rows_of_different_lengths(rng, tmp_path):
    # a fixed-size cache of 8 positions; rows hold 5 and 3 tokens before this one
    m, feeds = _case(rng, 2, 1, 8, [6, 4])
    want = check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)
    assert want["y1"].shape == (2, NKV, 8, H)


def test_decode_growing_cache(rng, tmp_path):
    m, feeds = _case(rng, 2, 1, 5, [6, 6])
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_chunk_after_past(rng, tmp_path):
    m, feeds = _case(rng, 1, 3, 4, [7])
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_packed_qkv(rng, tmp_path):
    m, feeds = _case(rng, 2, 5, 0, [5, 5], packed=True)
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("interleaved", [0, 1])
@pytest.mark.parametrize("dim", [H, H // 2])
def test_rotary(rng, tmp_path, interleaved, dim):
    m, feeds = _case(rng, 2, 1, 6, [7, 5], rotary=dim, attrs={"rotary_interleaved": interleaved})
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)
    m, feeds = _case(rng, 1, 5, 0, [5], rotary=dim, attrs={"rotary_interleaved": interleaved})
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("attrs", [{"local_window_size": 3}, {"softcap": 2.5}, {"scale": 0.2},
                                   {"smooth_softmax": 1}])
def test_options(rng, tmp_path, attrs):
    m, feeds = _case(rng, 2, 6, 0, [6, 6], attrs=attrs)
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)
    m, feeds = _case(rng, 2, 1, 7, [8, 6], attrs=attrs)
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_head_sink(rng, tmp_path):
    sink = nonzero_normal(rng, (NQ,))
    m, feeds = _case(rng, 2, 4, 0, [4, 4], extra=[None, None, None, None, ("sink", sink)])
    check(m, feeds, tmp_path, rtol=1e-4, atol=1e-5)


def test_quantized_cache_is_refused(rng, tmp_path):
    import onnx

    import npurun
    m, _ = _case(rng, 1, 2, 0, [2], attrs={"k_quant_type": "PER_TENSOR"})
    onnx.save(m, tmp_path / "g.onnx")
    with pytest.raises(npurun.NpurunError, match="k_quant_type=PER_TENSOR: quantized KV caches are not supported"):
        npurun.load(tmp_path / "g.onnx")
