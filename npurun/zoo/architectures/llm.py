"""Llama-class decoder-only LLMs as Qualcomm's Genie pipeline runs them (random, lazily
broadcast weights: a 7B model's shapes without its 28 GB): a prompt processor that takes 128
tokens at a time and a token generator that takes one, both over a static 4096-token KV cache
(the cache is a graph input; the new keys/values are outputs the runtime writes back).

A layer: RMSNorm, Q/K/V projections, rotary embedding on Q and K (cos/sin tables are inputs,
computed by the host from the positions), attention over the cache with grouped-query heads,
the output projection, RMSNorm, the SiLU-gated MLP (gate, up, down). Grouped-query attention
is written without repeating the cache: the G query heads that share a KV head are stacked
along the rows, Q (1, Hkv, G*T, hd) against K (1, Hkv, hd, C).

`LLMS` holds the published configurations (Hugging Face config.json of each model) of every
model in the AI Hub LLM table; names with the older `_quantized` suffix are the same models.
"""
from __future__ import annotations

from dataclasses import dataclass

from .builder import Builder


@dataclass(frozen=True)
class LLMConfig:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    head_dim: int = 0        # 0: hidden // heads
    context: int = 4096      # the KV cache AI Hub's genie bundle is compiled for
    hf: str = ""             # the model card the numbers come from

    @property
    def hd(self) -> int:
        return self.head_dim or self.hidden // self.heads


_LLAMA3_8B = LLMConfig(4096, 32, 32, 8, 14336, 128256, hf="meta-llama/Meta-Llama-3-8B")
_LLAMA2_7B = LLMConfig(4096, 32, 32, 32, 11008, 32000, context=1024, hf="meta-llama/Llama-2-7b-chat-hf")
LLMS: dict[str, LLMConfig] = {
    "allam_7b": LLMConfig(4096, 32, 32, 32, 11008, 64000, hf="ALLaM-AI/ALLaM-7B-Instruct-preview"),
    "falcon_v3_7b_instruct": LLMConfig(3072, 28, 12, 4, 23040, 131072, head_dim=256, hf="tiiuae/Falcon3-7B-Instruct"),
    "ibm_granite_v3_1_8b_instruct": LLMConfig(4096, 40, 32, 8, 12800, 49155, hf="ibm-granite/granite-3.1-8b-instruct"),
    "llama_v2_7b_chat": _LLAMA2_7B,
    "llama_v3_1_8b_chat": _LLAMA3_8B, "llama_v3_1_8b_instruct": _LLAMA3_8B,
    "llama_v3_1_sea_lion_3_5_8b_r": _LLAMA3_8B,
    "llama_v3_2_3b_chat": LLMConfig(3072, 28, 24, 8, 8192, 128256, hf="meta-llama/Llama-3.2-3B-Instruct"),
    "llama_v3_2_3b_instruct": LLMConfig(3072, 28, 24, 8, 8192, 128256, hf="meta-llama/Llama-3.2-3B-Instruct"),
    "llama_v3_8b_chat": _LLAMA3_8B, "llama_v3_8b_instruct": _LLAMA3_8B, "llama_v3_elyza_jp_8b": _LLAMA3_8B,
    "llama_v3_taide_8b_chat": _LLAMA3_8B,
    "phi_3_5_mini_instruct": LLMConfig(3072, 32, 32, 32, 8192, 32064, hf="microsoft/Phi-3.5-mini-instruct"),
    "qwen2_5_1_5b_instruct": LLMConfig(1536, 28, 12, 2, 8960, 151936, hf="Qwen/Qwen2.5-1.5B-Instruct"),
    "qwen2_5_7b_instruct": LLMConfig(3584, 28, 28, 4, 18944, 152064, hf="Qwen/Qwen2.5-7B-Instruct"),
}
LLMS.update({f"{k}_quantized": v for k, v in list(LLMS.items()) if k.endswith(("_chat", "_instruct", "_7b"))})
# Same weights' shapes, one measurement: which table rows are one architecture (for
# leave-one-architecture-out).
def arch_key(cfg: LLMConfig) -> tuple:
    return (cfg.hidden, cfg.layers, cfg.heads, cfg.kv_heads, cfg.ffn, cfg.vocab, cfg.context)


def llm(model: str, tokens: int = 1, name: str | None = None):
    """The graph of one pass of `model` over `tokens` new tokens (128: the prompt processor;
    1: the token generator) with cfg.context - tokens positions already in the cache."""
    cfg = LLMS[model]
    d, h, kvh, hd = cfg.hidden, cfg.heads, cfg.kv_heads, cfg.hd
    g_, t, past = h // kvh, tokens, cfg.context - tokens
    b = Builder(name or f"{model}_{'prompt' if tokens > 1 else 'token'}{tokens}", lazy=True)
    ids = b.input("input_ids", (1, t), "i32")
    mask = b.input("attention_mask", (1, 1, 1, t, cfg.context))   # 0 / -inf: causal and filled
    cos, sin = b.input("cos", (1, 1, t, hd)), b.input("sin", (1, 1, t, hd))
    x = b.node("gather", [b.weight((cfg.vocab, d), 0.02, "emb"), ids], axis=0)   # (1, T, d)

    def rope(z):  # z (1, n, T, hd): z cos + rotate_half(z) sin
        a, c = b.node("split", [z, b.ints([hd // 2, hd // 2])], n_out=2, axis=-1)
        return b.add(b.mul(z, cos), b.mul(b.concat([b.node("neg", [c]), a], axis=-1), sin))

    outs = []
    for i in range(cfg.layers):
        pk = b.input(f"past_key_{i}", (1, kvh, hd, past))
        pv = b.input(f"past_value_{i}", (1, kvh, past, hd))
        y = b.rms_norm(x)
        q = rope(b.transpose(b.reshape(b.linear(y, h * hd, bias=False), [1, t, h, hd]), [0, 2, 1, 3]))
        k = rope(b.transpose(b.reshape(b.linear(y, kvh * hd, bias=False), [1, t, kvh, hd]), [0, 2, 1, 3]))
        v = b.transpose(b.reshape(b.linear(y, kvh * hd, bias=False), [1, t, kvh, hd]), [0, 2, 1, 3])
        outs += [k, v]
        kk = b.concat([pk, b.transpose(k, [0, 1, 3, 2])], axis=3)            # (1, Hkv, hd, C)
        vv = b.concat([pv, v], axis=2)                                         # (1, Hkv, C, hd)
        s = b.node("matmul", [b.reshape(b.mul(q, b.floats(hd ** -0.5)), [1, kvh, g_ * t, hd]), kk])
        s = b.add(b.reshape(s, [1, kvh, g_, t, cfg.context]), mask)
        p = b.reshape(b.node("softmax", [s], axis=-1), [1, kvh, g_ * t, cfg.context])
        o = b.reshape(b.node("matmul", [p, vv]), [1, h, t, hd])
        x = b.add(x, b.linear(b.reshape(b.transpose(o, [0, 2, 1, 3]), [1, t, h * hd]), d, bias=False))
        y = b.rms_norm(x)
        gate = b.linear(y, cfg.ffn, bias=False)
        act = b.mul(gate, b.node("sigmoid", [gate]))
        x = b.add(x, b.linear(b.mul(act, b.linear(y, cfg.ffn, bias=False)), d, bias=False))
    logits = b.linear(b.rms_norm(x), cfg.vocab, bias=False)
    return b.output(logits, *outs)


def reference_macs(model: str, tokens: int) -> int:
    """MACs of one pass counted from the configuration alone (independent of the graph): every
    projection and the LM head per token, plus Q K^T and P V over the whole cache."""
    c = LLMS[model]
    per_token = c.layers * (c.hidden * c.heads * c.hd * 2 + c.hidden * c.kv_heads * c.hd * 2
                            + 3 * c.hidden * c.ffn) + c.hidden * c.vocab
    attention = c.layers * 2 * c.heads * c.hd * c.context
    return tokens * (per_token + attention)
