"""Generative models: decoder-only LLMs with a KV cache kept in place (docs/generate.md).

    gen = npurun.Generator(model_dir, device="cpu")
    gen.generate("Once upon a time", max_new_tokens=64).text
"""
from .generator import Generation, Generator, KVCache, Piece, Stream
from .sampling import Sampling

__all__ = ["Generator", "Generation", "KVCache", "Piece", "Stream", "Sampling"]
