"""The decoder in a model folder, in either of the two formats users bring (docs/generate.md):

- **Hugging Face Optimum** (`optimum-cli export onnx --task text-generation-with-past`, and
  scripts/export_decoder.py): `model.onnx` (or the legacy merged `decoder_model_merged.onnx`
  with its `use_cache_branch` input) taking input_ids, attention_mask, [position_ids],
  past_key_values.{i}.key/.value and giving logits and present.{i}.key/.value, with
  config.json / generation_config.json beside it. Its cache grows by concatenation; the
  pass kv_cache_in_place turns that into writes into one buffer.
- **ONNX Runtime GenAI's model builder**: `genai_config.json` naming the file, its inputs and
  outputs (GroupQueryAttention over past/present buffers of the full context, MatMulNBits,
  SkipSimplifiedLayerNormalization...). GroupQueryAttention writes the new rows into the
  buffer it is given when that buffer has room (past_present_share_buffer), so the graph runs
  as it is.

Either way a step is: ids (1, S) + the cache buffers + the number of rows already in them
-> logits (1, S, V), the buffers holding S more rows. Batch size 1.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..errors import ModelError

OPTIMUM_FILES = ("model.onnx", "decoder_model_merged.onnx")


@dataclass
class DecoderSpec:
    """Everything the generator needs to know about a decoder file."""
    path: Path
    format: str  # "optimum" or "genai"
    layers: int
    kv_heads: int
    head_size: int
    dtype: str  # the cache's element type (NPU-IR name)
    max_length: int  # positions the model was trained for (its context)
    past: list[tuple[str, str]] = field(default_factory=list)  # (key input, value input) per layer
    present: list[tuple[str, str]] = field(default_factory=list)
    input_ids: str = "input_ids"
    attention_mask: str | None = "attention_mask"
    position_ids: str | None = None
    use_cache_branch: str | None = None
    logits: str = "logits"
    eos: tuple[int, ...] = ()
    bos: int | None = None


def _json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelError(f"{path}: not a readable JSON file ({e})") from None


def _ids(v) -> tuple[int, ...]:
    if v is None:
        return ()
    return tuple(int(x) for x in (v if isinstance(v, list) else [v]))


def describe(folder: Path, graph) -> DecoderSpec:
    """The spec of the decoder in `folder` whose imported graph is `graph`."""
    genai = _json(folder / "genai_config.json")
    names = set(graph.inputs)
    if genai:
        m = genai.get("model", {})
        d = m.get("decoder", {})
        ins, outs = d.get("inputs", {}), d.get("outputs", {})
        pk, pv = ins.get("past_key_names", "past_key_values.%d.key"), ins.get("past_value_names", "past_key_values.%d.value")
        ok, ov = outs.get("present_key_names", "present.%d.key"), outs.get("present_value_names", "present.%d.value")
        layers = int(d.get("num_hidden_layers", 0))
        spec = DecoderSpec(
            path=folder / d.get("filename", "model.onnx"), format="genai", layers=layers,
            kv_heads=int(d.get("num_key_value_heads", 0)), head_size=int(d.get("head_size", 0)),
            dtype="f32", max_length=int(m.get("context_length") or genai.get("search", {}).get("max_length") or 0),
            past=[(pk % i, pv % i) for i in range(layers)], present=[(ok % i, ov % i) for i in range(layers)],
            input_ids=ins.get("input_ids", "input_ids"), attention_mask=ins.get("attention_mask"),
            position_ids=ins.get("position_ids") if ins.get("position_ids") in names else None,
            logits=outs.get("logits", "logits"), eos=_ids(m.get("eos_token_id")), bos=m.get("bos_token_id"))
    else:
        layers = 0
        while f"past_key_values.{layers}.key" in names:
            layers += 1
        if not layers:
            raise ModelError(f"{graph.source}: no past_key_values.0.key input: not a decoder exported with its "
                             f"cache (optimum-cli export onnx --task text-generation-with-past), and no "
                             f"genai_config.json beside it")
        cfg = _json(folder / "config.json")
        gen = _json(folder / "generation_config.json")
        spec = DecoderSpec(
            path=Path(graph.source), format="optimum", layers=layers, kv_heads=0, head_size=0, dtype="f32",
            max_length=int(cfg.get("max_position_embeddings") or cfg.get("n_positions") or cfg.get("n_ctx") or 0),
            past=[(f"past_key_values.{i}.key", f"past_key_values.{i}.value") for i in range(layers)],
            present=[(f"present.{i}.key", f"present.{i}.value") for i in range(layers)],
            attention_mask="attention_mask" if "attention_mask" in names else None,
            position_ids="position_ids" if "position_ids" in names else None,
            use_cache_branch="use_cache_branch" if "use_cache_branch" in names else None,
            eos=_ids(gen.get("eos_token_id", cfg.get("eos_token_id"))),
            bos=gen.get("bos_token_id", cfg.get("bos_token_id")))
    _check_io(spec, graph)
    v = graph.values[spec.past[0][0]]
    spec.dtype = v.dtype
    for attr, dim in (("kv_heads", v.shape[1]), ("head_size", v.shape[3])):
        if isinstance(dim, int):
            setattr(spec, attr, dim)
        elif not getattr(spec, attr):
            raise ModelError(f"{graph.source}: cache input {spec.past[0][0]!r} has a symbolic {attr.replace('_', ' ')} "
                             f"({dim!r}) and no config gives it")
    if spec.max_length <= 0:
        spec.max_length = 2048
    return spec


def _check_io(spec: DecoderSpec, graph) -> None:
    names, outs = set(graph.inputs), set(graph.outputs)
    want = [spec.input_ids] + [n for kv in spec.past for n in kv]
    missing = [n for n in want if n not in names] + [n for kv in spec.present for n in kv if n not in outs]
    if spec.logits not in outs:
        missing.append(spec.logits)
    if missing:
        raise ModelError(f"{graph.source}: the {spec.format} decoder format needs input/output(s) "
                         f"{', '.join(map(repr, missing[:6]))}; the model has inputs {sorted(names)[:8]}...")
    for k, _ in spec.past:
        v = graph.values[k]
        if v.shape is None or len(v.shape) != 4:
            raise ModelError(f"{graph.source}: cache input {k!r} must be (batch, heads, rows, head size), "
                             f"got {v.shape}")
    extra = names - set(want) - {spec.attention_mask, spec.position_ids, spec.use_cache_branch}
    if extra:
        raise ModelError(f"{graph.source}: input(s) {', '.join(sorted(map(repr, extra)))} are not part of "
                         f"the {spec.format} decoder format; the generator cannot feed them")


def find(folder: Path) -> Path:
    """The decoder file of a model folder."""
    genai = folder / "genai_config.json"
    if genai.exists():
        name = _json(genai).get("model", {}).get("decoder", {}).get("filename", "model.onnx")
        p = folder / name
        if not p.exists():
            raise ModelError(f"{genai}: names decoder file {name!r}, which is not in {folder}")
        return p
    for name in OPTIMUM_FILES:
        if (folder / name).exists():
            return folder / name
    raise ModelError(f"{folder}: no decoder found: expected genai_config.json (onnxruntime-genai's model "
                     f"builder) or {' / '.join(OPTIMUM_FILES)} (an Optimum export) in the folder")


def in_place(graph, spec: DecoderSpec):
    """The graph as the generator runs it: for the Optimum format, the cache kept in place
    (passes/kv_cache_in_place.py), the legacy merged decoder's `use_cache_branch` first fixed
    to true and its If inlined (passes/inline_constant_if.py: the cached branch handles the
    first step too, with no rows of past); a GenAI graph runs as it is."""
    if spec.format != "optimum":
        return graph
    from ..passes.kv_cache_in_place import kv_cache_in_place
    g = graph.copy()
    if spec.use_cache_branch:
        from ..passes.inline_constant_if import inline_constant_if
        v = g.values[spec.use_cache_branch]
        v.data = np.ones([d if isinstance(d, int) else 1 for d in v.shape], np.bool_)
        v.shape = v.data.shape
        g.inputs.remove(spec.use_cache_branch)
        g = inline_constant_if(g)
    pairs = [(p, q) for ps, qs in zip(spec.past, spec.present) for p, q in zip(ps, qs)]
    return kv_cache_in_place(g, pairs=pairs, length="past_length")
