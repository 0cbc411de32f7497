"""LLM decode side by side (issue M): npurun.Generator against ONNX Runtime driving the Optimum
export (the cache fed back by concatenation, as Optimum's ORTModelForCausalLM runs it) and
onnxruntime-genai on its own builder's int4 model, at 1 and 2 threads, alternating in one
process; time to first token (a 128-token prompt) and decode tokens/s (64 greedy tokens),
medians over rounds; ratios npurun / peer (higher is better for tokens/s).

    python bench/generate.py [--rounds 3] [--threads 1 2] [--only bundled,llama125m] [--json out.json]

Models: the bundled story model (npurun/zoo/storyteller, 2M parameters) and a Llama
architecture of 125M parameters (hidden 768, 12 layers, 12 query / 4 key-value heads, vocab
32,000) with random weights, built once into ~/.cache/npurun/bench/generate (transformers +
scripts/export_decoder.py, and onnxruntime-genai's builder at int4 and fp32). Needs
`pip install -e '.[test]'`. Never asserts.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import npurun  # noqa: E402
from npurun import zoo  # noqa: E402
from npurun.commands.bench import machine  # noqa: E402

CACHE = Path(os.environ.get("NPURUN_BENCH_CACHE", Path.home() / ".cache" / "npurun" / "bench" / "generate"))
PROMPT, NEW = 128, 64


# ------------------------------------------------------------------ models

def build_llama125m() -> Path:
    """CACHE/llama125m/{hf, optimum, genai-int4, genai-fp32}, built on first use."""
    root = CACHE / "llama125m"
    if (root / "done").exists():
        return root
    import torch
    import transformers as T
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    from export_decoder import export_optimum
    shutil.rmtree(root, ignore_errors=True)
    hf = root / "hf"
    vocab = 32000
    # a tokenizer of 32,000 plain tokens: the bench feeds ids; the builder wants a tokenizer
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2").save_pretrained(hf)
    torch.manual_seed(0)
    cfg = T.LlamaConfig(vocab_size=vocab, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                        num_attention_heads=12, num_key_value_heads=4, max_position_embeddings=2048,
                        bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    model = T.LlamaForCausalLM(cfg).eval()
    print(f"llama125m: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters; exporting", flush=True)
    model.save_pretrained(hf)
    export_optimum(model, root / "optimum", tokenizer_dir=hf)
    _genai_builds(hf, root)
    return root


def build_bundled() -> Path:
    """The bundled model, and its GenAI-builder versions (from the same weights)."""
    root = CACHE / "bundled"
    src = zoo.path("storyteller")
    if (root / "done").exists():
        return root
    shutil.rmtree(root, ignore_errors=True)
    from transformers import AutoModelForCausalLM
    hf = root / "hf"
    # the builder reads a transformers folder: the bundled weights are in the ONNX file only,
    # so scripts/train_llm.py's hf/ copy is rebuilt from it (the same weights)
    model = _hf_from_onnx(src)
    model.save_pretrained(hf)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / f, hf / f)
    _check_same(AutoModelForCausalLM.from_pretrained(hf), src / "model.onnx")
    shutil.copytree(src, root / "optimum")
    _genai_builds(hf, root)
    return root


def _genai_builds(hf: Path, root: Path) -> None:
    """onnxruntime-genai's builder on `hf`, at int4 and fp32, into root/genai-*; then root/done."""
    for prec in ("int4", "fp32"):
        r = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(hf), "-o",
                            str(root / f"genai-{prec}"), "-p", prec, "-e", "cpu"], capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"onnxruntime-genai's builder failed on {hf} ({prec}):\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    (root / "done").write_text("ok")


def _hf_from_onnx(folder: Path):
    """A LlamaForCausalLM with the weights of an Optimum export of one (matched by shape and
    order of the MatMul weights, which the exporter stores transposed)."""
    import onnx
    import torch
    import transformers as T
    from onnx import numpy_helper
    cfg = T.AutoConfig.from_pretrained(folder)
    model = T.LlamaForCausalLM(cfg).eval()
    inits = {i.name: numpy_helper.to_array(i) for i in onnx.load(folder / "model.onnx").graph.initializer}
    sd = model.state_dict()
    named = {k[2:] if k.startswith("m.") else k: v for k, v in inits.items()}
    mats = [v for k, v in inits.items() if k.startswith("onnx::MatMul")]
    lin = [k for k in sd if k.endswith(".weight") and sd[k].ndim == 2 and "embed" not in k]
    with torch.no_grad():
        for k in sd:
            if k in named:
                sd[k].copy_(torch.from_numpy(named[k]))
        for k, w in zip(lin, mats):
            sd[k].copy_(torch.from_numpy(w.T.copy()))
    return model


def _check_same(model, onnx_path: Path) -> None:
    """The rebuilt transformers model computes the ONNX file's logits (else the weights were
    matched wrongly and the GenAI rows would be of another model)."""
    import onnxruntime as ort
    import torch
    ids = np.arange(3, 19)[None]
    s = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    feeds = {i.name: np.zeros([d if isinstance(d, int) else 0 for d in i.shape], np.float32)
             for i in s.get_inputs() if i.name.startswith("past")}
    feeds.update(input_ids=ids, attention_mask=np.ones_like(ids), position_ids=np.arange(16)[None])
    want = s.run(["logits"], feeds)[0]
    with torch.no_grad():
        got = model(input_ids=torch.from_numpy(ids)).logits.numpy()
    if not np.allclose(got, want, atol=1e-3 * np.abs(want).max()):
        raise SystemExit("the transformers copy of the bundled model does not reproduce its ONNX logits")


# ------------------------------------------------------------------ runners

def run_npurun(gen, prompt):
    r = gen.generate(prompt, max_new_tokens=NEW, ignore_eos=True)
    return r.ttft_ms, r.tokens_per_s, r.ids


def ort_session(path: Path, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def run_ort(sess, spec, prompt):
    """Greedy decode with ONNX Runtime on an Optimum file: present fed back as past."""
    names = {i.name for i in sess.get_inputs()}
    outs = [o.name for o in sess.get_outputs()]
    past = {n: np.zeros((1, spec.kv_heads, 0, spec.head_size), np.float32) for kv in spec.past for n in kv}
    t0 = time.perf_counter()
    seq, n, ids, t_first = list(prompt), 0, [], None
    chunk = list(prompt)
    for _ in range(NEW):
        f = {"input_ids": np.array([chunk], np.int64), "attention_mask": np.ones((1, n + len(chunk)), np.int64), **past}
        if "position_ids" in names:
            f["position_ids"] = np.arange(n, n + len(chunk), dtype=np.int64)[None]
        res = dict(zip(outs, sess.run(None, f)))
        n += len(chunk)
        tok = int(np.argmax(res["logits"][0, -1]))
        if t_first is None:
            t_first = time.perf_counter()
        ids.append(tok)
        past = {k: res[k.replace("past_key_values", "present")] for k in past}
        chunk = [tok]
    end = time.perf_counter()
    return (t_first - t0) * 1e3, (NEW - 1) / (end - t_first), ids


def og_model(folder: Path, threads: int):
    """onnxruntime-genai's model with its session at `threads` (a copy of the config naming them)."""
    import onnxruntime_genai as og
    d = folder.parent / f"{folder.name}-t{threads}"
    if not d.exists():
        d.mkdir()
        for f in folder.iterdir():
            if f.name != "genai_config.json":
                (d / f.name).symlink_to(f.resolve())
        cfg = json.loads((folder / "genai_config.json").read_text())
        so = cfg["model"]["decoder"].setdefault("session_options", {})
        so["intra_op_num_threads"], so["inter_op_num_threads"] = threads, 1
        (d / "genai_config.json").write_text(json.dumps(cfg, indent=1))
    return og.Model(str(d))


def run_og(model, prompt):
    import onnxruntime_genai as og
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + NEW, min_length=len(prompt) + NEW, do_sample=False)
    t0 = time.perf_counter()
    g = og.Generator(model, params)
    g.append_tokens(prompt)
    ids, t_first = [], None
    while not g.is_done():
        g.generate_next_token()
        if t_first is None:
            t_first = time.perf_counter()
        ids.append(int(g.get_next_tokens()[0]))
    end = time.perf_counter()
    return (t_first - t0) * 1e3, (len(ids) - 1) / (end - t_first), ids


# ------------------------------------------------------------------ the table

def measure(name: str, root: Path, threads: int, rounds: int) -> dict:
    rng = np.random.default_rng(0)
    opt = npurun.Generator(root / "optimum", parallelism=threads)
    prompt = [int(t) for t in rng.integers(3, opt.vocab_size, PROMPT)]
    runners = {
        "npurun (Optimum file)": lambda: run_npurun(opt, prompt),
        "onnxruntime (Optimum file)": (lambda s=ort_session(opt.spec.path, threads): run_ort(s, opt.spec, prompt)),
    }
    for prec in ("int4", "fp32"):
        folder = root / f"genai-{prec}"
        g = npurun.Generator(folder, parallelism=threads)
        runners[f"npurun (GenAI {prec})"] = lambda g=g: run_npurun(g, prompt)
        runners[f"onnxruntime-genai ({prec})"] = lambda m=og_model(folder, threads): run_og(m, prompt)
    for fn in runners.values():  # warm-up: compile, pack, first-touch
        fn()
    got = {k: [] for k in runners}
    for _ in range(rounds):
        for k, fn in runners.items():
            ttft, tps, _ = fn()
            got[k].append((ttft, tps))
            time.sleep(0.1)
    med = {k: (statistics.median(t for t, _ in v), statistics.median(s for _, s in v)) for k, v in got.items()}
    return {"model": name, "threads": threads, "kv_cache_mb": opt.new_cache(opt.cache_rows(PROMPT + NEW)).nbytes / 2**20,
            "results": {k: {"ttft_ms": round(t, 2), "tokens_per_s": round(s, 2)} for k, (t, s) in med.items()}}


def print_table(rows: list[dict]) -> None:
    print(f"\n{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {machine()}, npurun {npurun.__version__}; "
          f"prompt {PROMPT} tokens, {NEW} new tokens (greedy), medians")
    print("\n| model | threads | runtime | TTFT ms | decode tokens/s | npurun / peer (tokens/s) |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        res = r["results"]
        pairs = {"onnxruntime (Optimum file)": "npurun (Optimum file)", "onnxruntime-genai (int4)": "npurun (GenAI int4)",
                 "onnxruntime-genai (fp32)": "npurun (GenAI fp32)"}
        for k, v in res.items():
            ratio = ""
            if k in pairs:
                ratio = f"**{res[pairs[k]]['tokens_per_s'] / v['tokens_per_s']:.2f}**"
            print(f"| {r['model']} | {r['threads']} | {k} | {v['ttft_ms']:.1f} | {v['tokens_per_s']:.1f} | {ratio} |")
    for model, mb in dict((r["model"], r["kv_cache_mb"]) for r in rows).items():
        print(f"\n{model}: npurun's KV cache {mb:.2f} MB for {PROMPT + NEW} tokens "
              f"(rows rounded up to 256; 2 x layers x kv heads x rows x head size x 4 bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--only", default="bundled,llama125m")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    builders = {"bundled": build_bundled, "llama125m": build_llama125m}
    rows = []
    for name in args.only.split(","):
        root = builders[name]()
        for t in args.threads:
            rows.append(measure(name, root, t, args.rounds))
            print(json.dumps(rows[-1]), flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
