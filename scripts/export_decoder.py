"""Export a transformers causal LM to ONNX in Hugging Face Optimum's decoder format, the format
npurun.Generator reads (docs/generate.md):

    inputs   input_ids (B, S) i64, attention_mask (B, P + S) i64, position_ids (B, S) i64,
             past_key_values.{i}.key / .value (B, Hkv, P, D)
    outputs  logits (B, S, V), present.{i}.key / .value (B, Hkv, P + S, D)

with the model's config.json and generation_config.json (and the tokenizer files, when a
tokenizer is given) beside model.onnx, as `optimum-cli export onnx --task
text-generation-with-past` writes them. Optimum itself (optimum-onnx 0.1.0) needs transformers
< 4.58, which cannot live beside the transformers this project pins, so this does what its
exporter does: TorchScript tracing (torch.onnx.export, dynamo=False) of the model with a
DynamicCache built from the flat past inputs, the same input/output names and dynamic axes.

    python scripts/export_decoder.py HF_MODEL_DIR OUT_DIR

Used by scripts/train_llm.py (the bundled model), tests/generate (random-weight Llama, Qwen2,
Phi-3, GPT-2 from their configs) and bench/generate.py. Needs torch and transformers
(`pip install -e '.[test]'`).
"""
from __future__ import annotations

import shutil
import sys
import warnings
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def kv_shape(config) -> tuple[int, int, int]:
    """(layers, key/value heads, head size) of a transformers decoder config."""
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    head = getattr(config, "head_dim", None) or hidden // heads
    return layers, kv, head


def export_optimum(model, out_dir, *, tokenizer_dir=None, opset: int = 17) -> Path:
    """Write OUT_DIR/model.onnx (+ config, generation config, tokenizer files) for `model`, a
    transformers *ForCausalLM in eval mode. Returns the .onnx path."""
    import torch
    from transformers.cache_utils import DynamicCache

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = model.config
    layers, kvh, head = kv_shape(cfg)

    class Flat(torch.nn.Module):
        """The model with the cache as flat tensors in and out (what the ONNX graph shows)."""

        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, input_ids, attention_mask, position_ids, *past):
            cache = DynamicCache(config=cfg)
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            o = self.m(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                       past_key_values=cache, use_cache=True)
            res = [o.logits]
            for layer in o.past_key_values.layers[:layers]:
                res += [layer.keys, layer.values]
            return tuple(res)

    # Traced with a past and several new tokens, so no branch for an empty cache or a single
    # token is baked in (the mask code takes its general path).
    b, s, p = 2, 3, 4
    ids = torch.randint(0, cfg.vocab_size, (b, s))
    mask = torch.ones(b, p + s, dtype=torch.long)
    pos = torch.arange(p, p + s).expand(b, s)
    past = [torch.randn(b, kvh, p, head) for _ in range(2 * layers)]
    kv_names = [f"{n}.{i}.{k}" for n in ("past_key_values",) for i in range(layers) for k in ("key", "value")]
    present = [f"present.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    dyn = {"input_ids": {0: "batch_size", 1: "sequence_length"},
           "attention_mask": {0: "batch_size", 1: "total_sequence_length"},
           "position_ids": {0: "batch_size", 1: "sequence_length"},
           "logits": {0: "batch_size", 1: "sequence_length"}}
    dyn.update({n: {0: "batch_size", 2: "past_sequence_length"} for n in kv_names})
    dyn.update({n: {0: "batch_size", 2: "total_sequence_length"} for n in present})
    path = out / "model.onnx"
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # the tracer's notes on Python branches it fixes
        torch.onnx.export(Flat().eval(), (ids, mask, pos, *past), str(path),
                          input_names=["input_ids", "attention_mask", "position_ids", *kv_names],
                          output_names=["logits", *present], dynamic_axes=dyn, opset_version=opset,
                          dynamo=False)
    cfg.save_pretrained(out)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(out)
    if tokenizer_dir is not None and Path(tokenizer_dir).resolve() != out.resolve():
        for name in TOKENIZER_FILES:
            if (Path(tokenizer_dir) / name).exists():
                shutil.copy(Path(tokenizer_dir) / name, out / name)
    return path


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        sys.exit("usage: python scripts/export_decoder.py HF_MODEL_DIR OUT_DIR")
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(args[0]).eval()
    print(export_optimum(model, args[1], tokenizer_dir=args[0]))


if __name__ == "__main__":
    main()
