"""Export one PyTorch corpus model (bench/corpus_models.py) to ONNX, in a process of its own so
that torch and transformers never share a process with a measurement.

    python bench/corpus_export.py NAME OUT.onnx

Weights are random (torch.manual_seed(0)); models come from their transformers configs, built
locally: nothing is downloaded. Needs `pip install -e '.[corpus]'`.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from corpus_models import BY_NAME  # noqa: E402


def _tiny(kind: str, kw: dict):
    """Plain torch.nn networks: the fixed per-run cost shows on them."""
    import torch.nn as nn
    if kind == "torch.mlp":  # Linear/ReLU stack: Gemm, Relu, ..., Softmax
        s = kw["sizes"]
        layers = []
        for a, b in zip(s[:-1], s[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        return nn.Sequential(*layers[:-1], nn.Softmax(-1))
    if kind == "torch.lenet":
        return nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 16, 5),
                             nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(),
                             nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))
    raise ValueError(kind)


def _config(T, name: str, kw: dict):
    kw = {k: (_config(T, *v) if isinstance(v, tuple) else v) for k, v in kw.items()}
    return getattr(T, name)(**kw)


def build(name: str):
    import torch
    spec = BY_NAME[name]
    cfg_name, kw, cls = spec.source
    torch.manual_seed(0)
    if cfg_name.startswith("torch."):
        return _tiny(cfg_name, kw).eval()
    import transformers as T
    cfg = _config(T, cfg_name, kw)
    if cls == "WhisperEncoder":
        return T.WhisperModel(cfg).get_encoder().eval()
    return getattr(T, cls)(cfg).eval()


class _Outputs:
    """Wraps a transformers model so the export returns plain tensors (no ModelOutput)."""

    @staticmethod
    def wrap(model, names):
        import torch
        if not hasattr(model, "config"):  # a plain torch.nn network takes its input positionally
            return model

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.m = model

            def forward(self, *args):
                out = self.m(**dict(zip(names, args)))
                if isinstance(out, torch.Tensor):
                    return out
                return tuple(v for v in (out.to_tuple() if hasattr(out, "to_tuple") else out)
                             if isinstance(v, torch.Tensor))
        return Wrapped().eval()


def export(name: str, out: Path) -> None:
    import torch
    spec = BY_NAME[name]
    feeds = spec.feeds()
    names = list(feeds)
    args = tuple(torch.from_numpy(feeds[k]) for k in names)
    model = _Outputs.wrap(build(name), names)
    tmp = out.with_name(out.name + ".part.onnx")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        if spec.producer == "dynamo":
            prog = torch.onnx.export(model, args, input_names=names, dynamo=True, opset_version=18,
                                     external_data=False, verbose=False)
            prog.save(str(tmp))
        else:
            torch.onnx.export(model, args, str(tmp), input_names=names, dynamo=False, opset_version=17)
    os.replace(tmp, out)


if __name__ == "__main__":
    export(sys.argv[1], Path(sys.argv[2]))
