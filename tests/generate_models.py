"""Small random-weight decoders for the generation tests, built here from transformers configs
(nothing downloaded), with a byte-level BPE tokenizer trained by `tokenizers` on this repo's
README, exported both ways users bring them:

- Optimum's decoder format (scripts/export_decoder.py: model.onnx with past_key_values.* in
  and present.* out, config.json, generation_config.json, tokenizer files);
- onnxruntime-genai's model builder (`python -m onnxruntime_genai.models.builder`: genai_config.json,
  GroupQueryAttention over a shared past/present buffer, MatMulNBits for int4).

Llama, Qwen2 and Phi-3 have fewer key/value heads than query heads (grouped-query attention);
GPT-2 has one key/value head per query head. Qwen2 ties its embeddings to the lm_head (the
builder's int4 graph then gathers from the quantized lm_head: GatherBlockQuantized). Weights are drawn with a wider spread than the
libraries' default (initializer_range 0.3) so the logits do not all tie and greedy decoding
is a real test.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

from export_decoder import export_optimum  # noqa: E402

LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, POSITIONS = 2, 128, 4, 2, 192, 256


def configs(vocab: int) -> dict:
    import transformers as T
    common = dict(vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                  num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, max_position_embeddings=POSITIONS,
                  initializer_range=0.3, bos_token_id=0, eos_token_id=1, pad_token_id=1, tie_word_embeddings=False)
    return {
        "llama": T.LlamaConfig(**common),
        "qwen2": T.Qwen2Config(**{**common, "tie_word_embeddings": True}),  # (GatherBlockQuantized at int4)
        "phi3": T.Phi3Config(**common, original_max_position_embeddings=POSITIONS),
        "gpt2": T.GPT2Config(vocab_size=vocab, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=POSITIONS,
                             initializer_range=0.3, bos_token_id=0, eos_token_id=1),
    }


def tokenizer(folder: Path, vocab: int = 320) -> int:
    """Train a byte-level BPE on the README and save it as transformers does; its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator((ROOT / "README.md").read_text().splitlines(), trainer)
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(folder)
    return tok.get_vocab_size()


def build(arch: str, root: Path):
    """root/hf (save_pretrained + tokenizer) and root/optimum; returns the torch model."""
    import torch
    from transformers import AutoModelForCausalLM
    hf = root / "hf"
    vocab = tokenizer(hf)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(configs(vocab)[arch]).eval()
    model.generation_config.eos_token_id = 1
    model.save_pretrained(hf)
    export_optimum(model, root / "optimum", tokenizer_dir=hf)
    return model


def merged(optimum: Path, out: Path) -> None:
    """The legacy merged-decoder layout of an Optimum export (optimum < 1.14's
    decoder_model_merged.onnx): an If on a `use_cache_branch` input chooses between a cached
    and an uncached copy of the decoder, the weights shared at top level. (Optimum's uncached
    copy takes no past; here both copies are the cached graph, which an empty past also runs.)"""
    import shutil

    import onnx
    from onnx import helper
    m = onnx.load(optimum / "model.onnx")
    g = m.graph
    outs = [o for o in g.output]
    made = {o for n in g.node for o in n.output}

    def branch(tag):
        """The decoder's nodes, every value they make renamed NAME+tag (names are unique
        across a model's graphs)."""
        nodes = []
        for n in g.node:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = n.name + tag
            c.input[:] = [i + tag if i in made else i for i in n.input]
            c.output[:] = [o + tag for o in n.output]
            nodes.append(c)
        results = [helper.make_tensor_value_info(o.name + tag, o.type.tensor_type.elem_type, None) for o in outs]
        return helper.make_graph(nodes, "decoder" + tag, [], results)

    then_g, else_g = branch("_cached"), branch("_uncached")
    flag = helper.make_tensor_value_info("use_cache_branch", onnx.TensorProto.BOOL, [1])
    node = helper.make_node("If", ["use_cache_branch"], [o.name for o in g.output], then_branch=then_g,
                            else_branch=else_g, name="optimum::if")
    graph = helper.make_graph([node], "merged", list(g.input) + [flag], list(g.output), list(g.initializer))
    model = helper.make_model(graph, opset_imports=m.opset_import, ir_version=m.ir_version)
    out.mkdir(parents=True, exist_ok=True)
    onnx.save(model, out / "decoder_model_merged.onnx")
    for f in optimum.iterdir():
        if f.suffix != ".onnx":
            shutil.copy(f, out / f.name)


def genai(hf: Path, out: Path, precision: str) -> subprocess.Popen:
    """Start onnxruntime-genai's model builder on an hf folder (a child process: it takes a few
    seconds, so the callers start several and wait)."""
    return subprocess.Popen([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o", str(out),
                             "-p", precision, "-e", "cpu"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
