"""Transformer encoders and decoders as AI Hub exports them (random weights): BERT-base, ViT-B/16,
CLIP ViT-B/16 (image and text towers), Whisper encoders (which also compute every decoder
layer's cross-attention K/V, as AI Hub's HfWhisperEncoder does) and one Whisper decoder step
over a 200-token self-attention cache, and SD 1.5's text encoder (CLIP ViT-L/14 text tower).

Layouts: activations are (1, T, d); heads are split as (1, H, T, hd) by reshape + transpose,
keys are used as (1, H, hd, S) (the transpose folded into the key's reshape), so attention is
two matrix products of activations, a scale, an optional mask add and a softmax. Linear layers
are matmul + bias add (the matrix unit's output stage adds the bias).
Whisper is the exception: AI Hub rewrites it for QNN (split-head attention: one chain of 1x1
convs, products and softmax per head; every linear layer a 1x1 conv on tokens laid out as an
NCHW map (1, d, 1, T); caches split and joined per head), and its builders follow that.
"""
from __future__ import annotations

import numpy as np

from .builder import Builder


def heads(b: Builder, y, h: int):
    """(1, T, h*hd) -> (1, h, T, hd)."""
    _, t, d = b.shape(y)
    return b.transpose(b.reshape(y, [1, t, h, d // h]), [0, 2, 1, 3])


def keys(b: Builder, y, h: int):
    """(1, S, h*hd) -> (1, h, hd, S): keys laid out for Q K^T."""
    _, s, d = b.shape(y)
    return b.transpose(b.reshape(y, [1, s, h, d // h]), [0, 2, 3, 1])


def merge(b: Builder, o):
    """(1, h, T, hd) -> (1, T, h*hd)."""
    _, h, t, hd = b.shape(o)
    return b.reshape(b.transpose(o, [0, 2, 1, 3]), [1, t, h * hd])


def attend(b: Builder, q, k, v, mask=None):
    """softmax(q k / sqrt(hd) + mask) v for q (1, H, T, hd), k (1, H, hd, S), v (1, H, S, hd)."""
    hd = b.shape(q)[-1]
    s = b.node("matmul", [b.mul(q, b.floats(hd ** -0.5)), k])
    if mask is not None:
        s = b.add(s, mask)
    return b.node("matmul", [b.node("softmax", [s], axis=-1), v])


def self_attention(b: Builder, x, h: int, mask=None, kv_bias=True):
    d = b.shape(x)[-1]
    q, k, v = heads(b, b.linear(x, d), h), keys(b, b.linear(x, d, bias=kv_bias), h), heads(b, b.linear(x, d), h)
    return b.linear(merge(b, attend(b, q, k, v, mask)), d)


def mlp(b: Builder, x, hidden: int, act="gelu"):
    d = b.shape(x)[-1]
    y = b.linear(x, hidden)
    if act == "quick_gelu":  # CLIP's x * sigmoid(1.702 x)
        y = b.mul(y, b.node("sigmoid", [b.mul(y, b.floats(1.702))]))
    else:
        y = b.node(act, [y])
    return b.linear(y, d)


def encoder_layer(b: Builder, x, h: int, hidden: int, mask=None, pre_norm=True, act="gelu"):
    if pre_norm:
        x = b.add(x, self_attention(b, b.layer_norm(x), h, mask))
        return b.add(x, mlp(b, b.layer_norm(x), hidden, act))
    x = b.layer_norm(b.add(x, self_attention(b, x, h, mask)))
    return b.layer_norm(b.add(x, mlp(b, x, hidden, act)))


def embed(b: Builder, ids, vocab: int, d: int):
    return b.node("gather", [b.weight((vocab, d), 0.02, "emb"), ids], axis=0)


# ---------------------------------------------------------------- models

def bert(layers=12, d=768, h=12, hidden=3072, seq=384, vocab=30522, name="bert_base"):
    """BERT-base as AI Hub's bert_base_uncased_hf: input ids and a padding mask of 384 tokens,
    post-norm layers, the last hidden state out."""
    b = Builder(name)
    ids = b.input("input_ids", (1, seq), "i32")
    mask = b.input("attention_mask", (1, 1, 1, seq))  # 0 / -inf per key, as the host makes it
    x = b.add(b.add(embed(b, ids, vocab, d), b.weight((seq, d), 0.02, "pos")), b.weight((d,), 0.02, "type"))
    x = b.layer_norm(x)
    for _ in range(layers):
        x = encoder_layer(b, x, h, hidden, mask, pre_norm=False)
    return b.output(x)


def _vit_tower(b: Builder, image, patch=16, d=768, h=12, layers=12, hidden=3072, act="gelu", pre_ln=False):
    x = b.conv(image, d, patch, s=patch, p=0)                       # (1, d, 14, 14)
    n = b.shape(x)[2] * b.shape(x)[3]
    x = b.transpose(b.reshape(x, [1, d, n]), [0, 2, 1])             # (1, 196, d)
    x = b.concat([b.weight((1, 1, d), 0.02, "cls"), x], axis=1)
    x = b.add(x, b.weight((n + 1, d), 0.02, "pos"))
    if pre_ln:
        x = b.layer_norm(x)
    for _ in range(layers):
        x = encoder_layer(b, x, h, hidden, act=act)
    return b.layer_norm(x)


def vit(name="vit"):
    """ViT-B/16 at 224x224 with its 1000-class head (AI Hub's vit: torchvision vit_b_16)."""
    b = Builder(name)
    x = _vit_tower(b, b.input("image", (1, 3, 224, 224)))
    cls = b.node("gather", [x, b.ints(0)], axis=1)                  # (1, d): the class token
    return b.output(b.linear(cls, 1000))


def _clip_text(b: Builder, ids, d, h, layers, seq=77, vocab=49408, act="quick_gelu"):
    causal = b.floats(np.triu(np.full((seq, seq), -1e4, np.float32), 1)[None, None])
    x = b.add(embed(b, ids, vocab, d), b.weight((seq, d), 0.02, "pos"))
    for _ in range(layers):
        x = encoder_layer(b, x, h, 4 * d, causal, act=act)
    return b.layer_norm(x)


def clip(name="openai_clip"):
    """CLIP ViT-B/16 (AI Hub's openai_clip: both towers in one graph, 150M parameters): a
    224x224 image and 77 text tokens in, the two projected, normalized embeddings and their
    similarity out."""
    b = Builder(name)
    img = _vit_tower(b, b.input("image", (1, 3, 224, 224)), act="quick_gelu", pre_ln=True)
    img = b.linear(b.node("gather", [img, b.ints(0)], axis=1), 512, bias=False)
    txt = _clip_text(b, b.input("text", (1, 77), "i32"), 512, 8, 12)
    txt = b.linear(b.node("gather", [txt, b.ints(76)], axis=1), 512, bias=False)  # the EOT token

    def unit(v):
        return b.node("div", [v, b.node("reduce_l2", [v, b.ints([-1])], keepdims=1)])
    logits = b.node("matmul", [unit(img), b.transpose(unit(txt), [1, 0])])
    return b.output(b.mul(logits, b.floats(100.0)))


def sd_text_encoder(name="sd15_text_encoder"):
    """Stable Diffusion 1.5's text encoder: CLIP ViT-L/14's text tower, 77 tokens, 12 layers
    of width 768, its last hidden state out (1, 77, 768)."""
    b = Builder(name)
    return b.output(_clip_text(b, b.input("tokens", (1, 77), "i32"), 768, 12, 12))


WHISPER = {"tiny": dict(d=384, h=6, layers=4), "base": dict(d=512, h=8, layers=6),
           "small": dict(d=768, h=12, layers=12)}


def _sha(b: Builder, x, h: int, k_bias=True, queries=True):
    """One split-head attention's projections as AI Hub writes them (its SHAAttention): tokens
    as an NCHW map (1, d, 1, T), a 1x1 conv per head: queries (1, 1, T, hd), keys laid out for
    q k (1, 1, hd, T), values (1, 1, T, hd). (The (1, 1, T, .) <-> (1, ., 1, T) permutes are the
    NCHW <-> NHWC relabels an NPU's converter drops.)"""
    hd = b.shape(x)[1] // h
    q = [_proj(b, x, hd) for _ in range(h)] if queries else None
    k = [b.transpose(b.conv(x, hd, 1, bias=k_bias), [0, 2, 1, 3]) for _ in range(h)]
    v = [_proj(b, x, hd) for _ in range(h)]
    return q, k, v


def _proj(b: Builder, x, n: int):
    """A linear layer as AI Hub writes it: a 1x1 conv on the (1, d, 1, T) map, back to (1, 1, T, n)
    tokens."""
    return b.transpose(b.conv(x, n, 1), [0, 2, 3, 1])


def _sha_out(b: Builder, q, k, v, mask=None):
    """Per head softmax(q k (+ mask)) v (the 1/sqrt(hd) is in q's weights), the heads
    concatenated, as an NCHW map (1, d, 1, T) for the output projection."""
    outs = []
    for qi, ki, vi in zip(q, k, v):
        s = b.node("matmul", [qi, ki])
        if mask is not None:
            s = b.add(s, mask)
        outs.append(b.node("matmul", [b.node("softmax", [s], axis=-1), vi]))
    return b.transpose(b.concat(outs, axis=-1), [0, 3, 1, 2])


def _tokens_map(b: Builder, x):
    """(1, 1, T, d) -> (1, d, 1, T): the NCHW <-> NHWC relabel."""
    return b.transpose(x, [0, 3, 1, 2])


def _ffn(b: Builder, x, hidden: int):
    """LayerNorm, fc1 + GELU, fc2 as 1x1 convs on (1, 1, T, d) tokens."""
    d = b.shape(x)[-1]
    return b.add(x, _proj(b, b.node("gelu", [b.conv(_tokens_map(b, b.layer_norm(x)), hidden, 1)]), d))


def whisper_encoder(size="tiny", cross_kv=True, name=None):
    """Whisper's encoder over 30 s of audio (80 x 3000 log-mel frames -> 1500 positions) as AI
    Hub's HfWhisperEncoder (qai_hub_models' hf_whisper model_adaptation): its 1-D convs as 1x3
    2-D convs, every attention split into one chain per head (1x1-conv projections, the
    products and softmax per head, the heads concatenated), linear layers as 1x1 convs; with
    `cross_kv` it also projects the output to every decoder layer's cross-attention keys and
    values, per head, concatenated over heads (h, 1, hd, 1500) and (h, 1, 1500, hd)."""
    cfg = WHISPER[size]
    d, h, layers = cfg["d"], cfg["h"], cfg["layers"]
    b = Builder(name or f"whisper_{size}_encoder")
    x = b.reshape(b.input("mel", (1, 80, 3000)), [1, 80, 1, 3000])
    x = b.node("gelu", [b.conv(x, d, (1, 3), p=[0, 1])])
    x = b.node("gelu", [b.conv(x, d, (1, 3), s=2, p=[0, 1])])                      # (1, d, 1, 1500)
    x = b.add(b.transpose(x, [0, 2, 3, 1]), b.weight((1500, d), 0.02, "pos"))       # (1, 1, 1500, d)
    for _ in range(layers):
        q, k, v = _sha(b, _tokens_map(b, b.layer_norm(x)), h)
        x = b.add(x, _proj(b, _sha_out(b, q, k, v), d))
        x = _ffn(b, x, 4 * d)
    x = _tokens_map(b, b.layer_norm(x))
    if not cross_kv:
        return b.output(x)
    outs = []
    for _ in range(layers):  # the decoder has as many layers as the encoder
        _, k, v = _sha(b, x, h, k_bias=False, queries=False)
        outs += [b.concat(k, axis=0), b.concat(v, axis=0)]
    return b.output(*outs)


def whisper_decoder(size="tiny", cache=200, vocab=51865, name=None):
    """One Whisper decoder step as AI Hub's HfWhisperDecoder: one token; per layer a
    self-attention cache of cache-1 past positions per head ((h, 1, hd, S) keys, (h, 1, S, hd)
    values, split into heads and each concatenated with the new position), masked to the
    positions filled, and the cache moved on by one (the oldest position dropped) as the new
    cache out; cross-attention over the encoder's 1500 precomputed keys/values, split into
    heads; split-head attention and 1x1-conv linears as in whisper_encoder; logits over the
    vocabulary as a 1x1 conv."""
    cfg = WHISPER[size]
    d, h, layers = cfg["d"], cfg["h"], cfg["layers"]
    hd = d // h
    b = Builder(name or f"whisper_{size}_decoder")
    ids = b.input("input_ids", (1, 1), "i32")
    mask = b.input("attention_mask", (1, 1, 1, cache))
    pos = b.input("position", (1, 1, d))      # the positional embedding row of this step
    x = b.reshape(b.add(embed(b, ids, vocab, d), pos), [1, 1, 1, d])
    outs = []

    def per_head(cache_in):  # (h, 1, ...) -> h x (1, 1, ...)
        return b.node("split", [cache_in, b.ints([1] * h)], n_out=h, axis=0)
    for i in range(layers):
        pk = b.input(f"k_cache_self_{i}", (h, 1, hd, cache - 1))
        pv = b.input(f"v_cache_self_{i}", (h, 1, cache - 1, hd))
        ck = b.input(f"k_cache_cross_{i}", (h, 1, hd, 1500))
        cv = b.input(f"v_cache_cross_{i}", (h, 1, 1500, hd))
        q, k, v = _sha(b, _tokens_map(b, b.layer_norm(x)), h, k_bias=False)
        k = [b.concat([p, n], axis=3) for p, n in zip(per_head(pk), k)]
        v = [b.concat([p, n], axis=2) for p, n in zip(per_head(pv), v)]
        outs += [b.node("slice", [b.concat(k, axis=0), b.ints([1]), b.ints([cache]), b.ints([3])]),
                 b.node("slice", [b.concat(v, axis=0), b.ints([1]), b.ints([cache]), b.ints([2])])]
        x = b.add(x, _proj(b, _sha_out(b, q, k, v, mask), d))
        y = _tokens_map(b, b.layer_norm(x))
        q = [_proj(b, y, hd) for _ in range(h)]
        x = b.add(x, _proj(b, _sha_out(b, q, per_head(ck), per_head(cv)), d))
        x = _ffn(b, x, 4 * d)
    logits = b.conv(_tokens_map(b, b.layer_norm(x)), vocab, 1, bias=False)        # (1, vocab, 1, 1)
    return b.output(logits, *outs)


def detr(depth=50, h=480, w=480, d=256, heads_=8, layers=6, ffn=2048, queries=100, classes=92, name=None):
    """DETR (facebook/detr-resnet-50 / -101) as AI Hub exports it at 480x480: a ResNet's
    stride-32 map projected to d channels, a post-norm encoder over its 15x15 positions and a
    post-norm decoder of 100 object queries, the sine position embedding added to the queries
    and keys of every attention (a constant here: it depends on the shape only), each decoder
    layer projecting the encoder's memory to its own cross-attention keys and values; class
    logits and sigmoid boxes out (the boxes' 3-layer MLP)."""
    from .classification import resnet_features
    b = Builder(name or f"detr_resnet{depth}")
    x = b.conv(resnet_features(b, b.input("image", (1, 3, h, w)), depth, frozen_bn=True), d, 1)  # (1, d, 15, 15)
    n = b.shape(x)[2] * b.shape(x)[3]
    mem = b.transpose(b.reshape(x, [1, d, n]), [0, 2, 1])                          # (1, n, d)
    pos = b.weight((1, n, d), 0.02, "pos")

    def attention(q_in, k_in, v_in):
        q = heads(b, b.linear(q_in, d), heads_)
        k = keys(b, b.linear(k_in, d), heads_)
        v = heads(b, b.linear(v_in, d), heads_)
        return b.linear(merge(b, attend(b, q, k, v)), d)

    for _ in range(layers):
        qk = b.add(mem, pos)
        mem = b.layer_norm(b.add(mem, attention(qk, qk, mem)))
        mem = b.layer_norm(b.add(mem, mlp(b, mem, ffn, act="relu")))
    query_pos = b.weight((1, queries, d), 0.02, "query")
    tgt = b.floats(np.zeros((1, queries, d), np.float32))
    mem_k = b.add(mem, pos)
    for _ in range(layers):
        qk = b.add(tgt, query_pos)
        tgt = b.layer_norm(b.add(tgt, attention(qk, qk, tgt)))
        tgt = b.layer_norm(b.add(tgt, attention(b.add(tgt, query_pos), mem_k, mem)))
        tgt = b.layer_norm(b.add(tgt, mlp(b, tgt, ffn, act="relu")))
    out = b.layer_norm(tgt)
    logits = b.linear(out, classes)
    box = b.node("relu", [b.linear(b.node("relu", [b.linear(out, d)]), d)])
    return b.output(logits, b.node("sigmoid", [b.linear(box, 4)]))
