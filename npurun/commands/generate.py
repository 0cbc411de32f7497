"""`npurun generate [MODEL_DIR] (--prompt TEXT | --ids 1,2,3)`: stream a decoder-only model's
continuation of a prompt to the terminal (npurun/generate, docs/generate.md). Without
MODEL_DIR it uses the bundled story model (npurun/zoo/storyteller, trained by
scripts/train_llm.py). `--json` prints, as the last line, one JSON object with the text, the
ids and the timings (time to first token, decode tokens/s)."""
from __future__ import annotations

import json
import sys

from ..errors import InputError


def add_parser(sub):
    p = sub.add_parser("generate", help="generate text with a decoder-only LLM (KV cache in place)")
    p.add_argument("model", nargs="?", metavar="MODEL_DIR",
                   help="a model folder: an Optimum export (model.onnx + config + tokenizer.json) or "
                        "onnxruntime-genai builder output (genai_config.json); default: the bundled story model")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="the prompt text")
    src.add_argument("--ids", help="the prompt as comma-separated token ids")
    p.add_argument("--max-new-tokens", type=int, default=128, help="at most this many new tokens (default 128)")
    p.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    p.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample within this probability mass (nucleus)")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1: none)")
    p.add_argument("--seed", type=int, default=None, help="seed of the sampling (the same tokens every run)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT", help="stop at this text (repeatable)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object as the last line: text, ids, ttft_ms, tokens_per_s")
    p.add_argument("--device", default="cpu", help="BACKEND[:TARGET]: cpu (default) or reference")
    p.add_argument("--threads", type=int, default=None, help="compute threads (default: all cores)")
    p.set_defaults(fn=run)


def _ids(text: str) -> list[int]:
    try:
        ids = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise InputError(f"--ids {text!r}: expected comma-separated integers, e.g. 1,2,3") from None
    if not ids:
        raise InputError("--ids: no token ids given")
    return ids


def run(args) -> int:
    from ..generate import Generator
    gen = Generator(args.model, device=args.device, parallelism=args.threads)
    prompt = args.prompt if args.prompt is not None else _ids(args.ids)
    stream = gen.stream(prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                        top_k=args.top_k, top_p=args.top_p, repetition_penalty=args.repetition_penalty,
                        seed=args.seed, stop=tuple(args.stop))
    out = sys.stdout
    if isinstance(prompt, str):
        out.write(prompt)
    for piece in stream:
        out.write(piece.text if piece.text is not None else f" {piece.id}")
        out.flush()
    r = stream.result
    out.write("\n")
    out.flush()
    if args.json:
        out.write(json.dumps({"text": r.text, "ids": r.ids, "prompt_tokens": len(r.prompt_ids),
                              "finish_reason": r.finish_reason, "ttft_ms": round(r.ttft_ms, 3),
                              "tokens_per_s": round(r.tokens_per_s, 2), "device": gen.device}) + "\n")
    else:
        print(f"[{len(r.ids)} tokens, first after {r.ttft_ms:.0f} ms, then {r.tokens_per_s:.1f} tokens/s "
              f"on {gen.device}]", file=sys.stderr)
    return 0
