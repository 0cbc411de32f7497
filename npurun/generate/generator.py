"""npurun.Generator: text generation with a decoder-only model, its KV cache kept in place.

    gen = npurun.Generator("models/storyteller", device="cpu")
    out = gen.generate("Once upon a time", max_new_tokens=64, temperature=0.8, top_p=0.95, seed=1)
    out.text, out.ids, out.ttft_ms, out.tokens_per_s
    for piece in gen.stream("Once upon a time", max_new_tokens=64):
        print(piece.text, end="", flush=True)

A generation allocates its cache once -- per layer a key and a value buffer (1, Hkv, C, D)
with C the prompt plus max_new_tokens rounded up to a multiple of 256 (at most the model's
context) -- then runs the prompt through the model in one step (prefill) and one step per
new token after it (decode), each step a task of the device's scheduler with the request's
priority and what remains of its timeout. The cache is written in place: a step moves only
its new rows into it (npurun/generate/model.py says how, per format).

Two compiled programs serve every generation of a Generator: one for any number of new
tokens (prefill) and, per cache size, one for a single token (decode), whose shape arithmetic
folds for batch 1 and one token.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, NamedTuple

import numpy as np

from ..errors import InputError
from ..ir.dtypes import to_numpy
from .model import describe, find, in_place
from .sampling import Sampling
from .text import Detokenizer, Tokenizer

ROWS = 256  # cache sizes are multiples of this many rows (one decode program per size)


class Piece(NamedTuple):
    """One generated token as a stream gives it: its id and the text it adds ("" while the
    text is held back: an incomplete character or a possible stop string; None without a
    tokenizer). Text held back to the end comes last, in a piece whose id is None."""
    id: int | None
    text: str | None


@dataclass
class Generation:
    """What one generation produced, and how fast."""
    ids: list[int]  # the new tokens (an end-of-sequence token is not included)
    text: str | None  # their text (None when the model folder has no tokenizer)
    prompt_ids: list[int]
    finish_reason: str  # "stop" (end of sequence or a stop string) or "length"
    ttft_ms: float  # from the call to the first new token (prefill included)
    tokens_per_s: float  # decode rate: tokens after the first / the time they took
    prefill_ms: float = 0.0
    decode_ms: float = 0.0
    cache_bytes: int = 0  # the KV cache's size: 2 x layers x Hkv x rows x head size x itemsize


@dataclass
class KVCache:
    """Per layer a key and a value buffer (1, Hkv, rows, D), zeroed once; `length` rows used."""
    keys: list[np.ndarray]
    values: list[np.ndarray]
    length: int = 0

    @classmethod
    def allocate(cls, layers: int, heads: int, rows: int, head_size: int, dtype) -> "KVCache":
        shape = (1, heads, rows, head_size)
        return cls([np.zeros(shape, dtype) for _ in range(layers)], [np.zeros(shape, dtype) for _ in range(layers)])

    @property
    def rows(self) -> int:
        return self.keys[0].shape[2]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.keys + self.values)


@dataclass
class _Request:
    prompt_ids: list[int]
    max_new_tokens: int
    sampling: Sampling
    stop: tuple[str, ...]
    priority: int | None
    deadline: float | None
    name: str
    eos: set
    t0: float = field(default_factory=time.perf_counter)


class Generator:
    def __init__(self, model_dir=None, device: str = "cpu", *, parallelism: int | None = None,
                 executor=None, max_length: int | None = None, name: str | None = None):
        from .. import zoo
        from ..frontend import load
        from ..runtime import Executor
        folder = Path(model_dir) if model_dir is not None else zoo.path("storyteller")
        if not folder.is_dir():
            raise InputError(f"{folder}: not a model folder (expected a folder holding the decoder .onnx, "
                             f"its config and tokenizer.json)")
        self.folder = folder
        graph = load(find(folder))
        self.spec = describe(folder, graph)
        self.graph = in_place(graph, self.spec)
        self.name = name or folder.name
        self.tokenizer = Tokenizer(folder) if (folder / "tokenizer.json").exists() else None
        self.max_length = min(max_length or self.spec.max_length, self.spec.max_length)
        if self.max_length < 2:
            raise InputError(f"max_length must be at least 2, got {max_length!r}")
        self.executor = executor if executor is not None else Executor(device, parallelism=parallelism, cascade=False)
        self.device = self.executor.device
        v = self.graph.values
        self._ids_dtype = to_numpy(v[self.spec.input_ids].dtype)
        self._mask_dtype = to_numpy(v[self.spec.attention_mask].dtype) if self.spec.attention_mask else None
        self._pos_dtype = to_numpy(v[self.spec.position_ids].dtype) if self.spec.position_ids else None
        self._cache_dtype = to_numpy(self.spec.dtype)
        self._lock = threading.Lock()
        self._prefill = self.executor.compile(self.graph)
        self._decode: dict[int, object] = {}
        self.eos = set(self.spec.eos)
        if self.tokenizer is not None and not self.eos:  # no eos id in the configs: the tokenizer's eos_token
            t = self.tokenizer.token(self.tokenizer.config.get("eos_token"))
            if t is not None:
                self.eos.add(t)

    def __repr__(self):
        return f"Generator({str(self.folder)!r}, device={self.device!r})"

    # ------------------------------------------------------------------ the public calls
    def generate(self, prompt, **kw) -> Generation:
        """Generate a continuation of `prompt` (text, or a list of token ids); the keywords are
        `stream`'s. Returns the new ids, their text and the timings."""
        s = self.stream(prompt, **kw)
        for _ in s:
            pass
        return s.result

    def stream(self, prompt, *, max_new_tokens: int = 128, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, repetition_penalty: float = 1.0, seed: int | None = None,
               stop=(), ignore_eos: bool = False, priority: int | None = None,
               timeout: float | None = None) -> "Stream":
        """An iterator of `Piece`s, one per new token as it is generated; its `result` (a
        Generation) is set once it is exhausted. Temperature 0 is greedy. `stop`: strings that
        end the generation (not included in the text); `ignore_eos`: go on past the model's
        end-of-sequence tokens (which then count as tokens; for benchmarks and tests). `priority` 0 (highest) .. 3 and
        `timeout` (seconds, the whole generation) go to the device's scheduler."""
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens < 1:
            raise InputError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise InputError(f"timeout must be a positive number of seconds, got {timeout!r}")
        if stop and self.tokenizer is None:
            raise InputError(f"{self.folder}: stop strings need the model's tokenizer.json")
        ids = self.encode(prompt)
        if len(ids) >= self.max_length:
            raise InputError(f"the prompt has {len(ids)} tokens; the model's context is {self.max_length}")
        room = self.max_length - len(ids)
        req = _Request(ids, min(int(max_new_tokens), room), Sampling(temperature, top_k, top_p, repetition_penalty, seed),
                       tuple(stop), priority, None, self.name, set() if ignore_eos else self.eos)
        if timeout is not None:
            req.deadline = req.t0 + timeout
        return Stream(self, req)

    def encode(self, prompt) -> list[int]:
        """Token ids of a prompt given as text or as ids (checked against the vocabulary)."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise InputError(f"{self.folder}: no tokenizer.json, so the prompt must be token ids")
            ids = self.tokenizer.encode(prompt)
            if not ids and self.spec.bos is not None:
                ids = [int(self.spec.bos)]
        else:
            try:
                ids = [int(i) for i in prompt]
            except (TypeError, ValueError):
                raise InputError("the prompt must be text or a list of token ids") from None
        if not ids:
            raise InputError("the prompt is empty")
        vocab = self.vocab_size
        bad = [i for i in ids if i < 0 or (vocab and i >= vocab)]
        if bad:
            raise InputError(f"token id(s) {bad[:5]} outside the vocabulary (0 .. {vocab - 1})")
        return ids

    @property
    def vocab_size(self) -> int | None:
        shape = self.graph.values[self.spec.logits].shape
        last = shape[-1] if shape else None
        return last if isinstance(last, int) else (self.tokenizer.vocab_size if self.tokenizer else None)

    # ------------------------------------------------------------------ steps
    def new_cache(self, rows: int) -> KVCache:
        """An empty cache of `rows` rows (at most the model's context)."""
        if not 0 < rows <= self.max_length:
            raise InputError(f"a cache of {rows} rows: the model's context is {self.max_length} positions")
        s = self.spec
        return KVCache.allocate(s.layers, s.kv_heads, rows, s.head_size, self._cache_dtype)

    def cache_rows(self, needed: int) -> int:
        """The cache size for a generation that needs `needed` rows."""
        return min(-(-needed // ROWS) * ROWS, self.max_length)

    def _program(self, n_new: int, rows: int):
        if n_new != 1:
            return self._prefill
        with self._lock:
            p = self._decode.get(rows)
        if p is None:
            p = self.executor.compile(self.graph, self._decode_shapes(rows))
            with self._lock:
                self._decode[rows] = p
        return p

    def _decode_shapes(self, rows: int) -> dict:
        s = self.spec
        shapes = {s.input_ids: (1, 1)}
        if s.position_ids:
            shapes[s.position_ids] = (1, 1)
        if s.attention_mask:  # batch 1; its length grows every step: left symbolic
            shapes[s.attention_mask] = (1, None)
        for k, v in s.past:
            shapes[k] = shapes[v] = (1, s.kv_heads, rows, s.head_size)
        return shapes

    def step(self, cache: KVCache, ids, *, priority=None, timeout=None, name=None) -> np.ndarray:
        """Run the model on new token `ids` after the cache's rows; the cache then holds them
        too. Returns the logits of the last new token (vocabulary,)."""
        return self.logits(cache, ids, priority=priority, timeout=timeout, name=name)[-1]

    def logits(self, cache: KVCache, ids, *, priority=None, timeout=None, name=None) -> np.ndarray:
        """`step`, returning the logits of every new token (len(ids), vocabulary): to score a
        text (perplexity) or to check a model against another runtime."""
        s = self.spec
        n, p = len(ids), cache.length
        if p + n > cache.rows:
            raise InputError(f"{n} new tokens do not fit the cache's {cache.rows - p} free rows")
        feeds = {s.input_ids: np.asarray(ids, self._ids_dtype).reshape(1, n)}
        if s.attention_mask:
            feeds[s.attention_mask] = np.ones((1, p + n), self._mask_dtype)
        if s.position_ids:
            feeds[s.position_ids] = np.arange(p, p + n, dtype=self._pos_dtype).reshape(1, n)
        for (k, v), kb, vb in zip(s.past, cache.keys, cache.values):
            feeds[k], feeds[v] = kb, vb
        if s.format == "optimum":
            feeds["past_length"] = np.array(p, np.int64)
        program = self._program(n, cache.rows)
        out = self.executor.run_program(program, feeds, priority=priority, timeout=timeout, name=name or self.name)
        for (k, v), kb, vb in zip(s.present, cache.keys, cache.values):
            for got, buf in ((out[k], kb), (out[v], vb)):
                if not np.shares_memory(got, buf):  # a kernel that wrote elsewhere: its rows, once
                    buf[:, :, p:p + n] = got[:, :, p:p + n]
        cache.length = p + n
        return out[s.logits][0]


class Stream:
    """Iterates a generation's Pieces; `result` is its Generation once exhausted."""

    def __init__(self, gen: Generator, req: _Request):
        self.gen, self.req = gen, req
        self.result: Generation | None = None
        self._it = self._run()

    def __iter__(self) -> Iterator[Piece]:
        return self._it

    def __next__(self) -> Piece:
        return next(self._it)

    def _remaining(self) -> float | None:
        if self.req.deadline is None:
            return None
        left = self.req.deadline - time.perf_counter()
        if left <= 0:
            from ..runtime.scheduler import TaskTimeout
            raise TaskTimeout(f"generation with {self.gen.name} timed out")
        return left

    def _run(self) -> Iterator[Piece]:
        gen, req = self.gen, self.req
        tok = gen.tokenizer
        detok = Detokenizer(tok, req.stop) if tok is not None else None
        sampler = req.sampling.sampler()
        cache = gen.new_cache(gen.cache_rows(len(req.prompt_ids) + req.max_new_tokens))
        context = list(req.prompt_ids)
        new: list[int] = []
        finish = "length"
        t_first = t_prefill = None
        pending = list(req.prompt_ids)
        try:
            while len(new) < req.max_new_tokens:
                logits = gen.step(cache, pending, priority=req.priority, timeout=self._remaining(), name=req.name)
                if t_prefill is None:
                    t_prefill = time.perf_counter()
                token = sampler(logits, context)
                if t_first is None:
                    t_first = time.perf_counter()
                if token in req.eos:
                    finish = "stop"
                    break
                new.append(token)
                context.append(token)
                text = detok.add(token) if detok is not None else None
                yield Piece(token, text)
                if detok is not None and detok.stopped:
                    finish = "stop"
                    break
                pending = [token]
            if detok is not None:
                tail = detok.finish()
                if tail:
                    yield Piece(None, tail)
        except Exception as e:
            from ..runtime.scheduler import drop_frames
            drop_frames(e)  # the finished frames below (step, logits) hold the cache too
            raise
        finally:
            end = time.perf_counter()
            first = t_first if t_first is not None else end
            n = len(new)
            decode_s = end - first
            self.result = Generation(
                ids=new, text=detok.text if detok is not None else None, prompt_ids=list(req.prompt_ids),
                finish_reason=finish, ttft_ms=(first - req.t0) * 1e3,
                tokens_per_s=(n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
                prefill_ms=((t_prefill or end) - req.t0) * 1e3, decode_ms=decode_s * 1e3,
                cache_bytes=cache.nbytes)
            # Freed now, not with this frame: an error's traceback keeps the frame (in a cycle
            # through the scheduler's future) until the cyclic collector runs.
            cache = logits = None

