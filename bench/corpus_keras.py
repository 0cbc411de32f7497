"""tf2onnx exports of Keras applications for the corpus (bench/corpus_models.py), made in an
exporter venv of their own: tensorflow-cpu pins ml_dtypes and protobuf ranges that do not
share a venv with this project's pins. The venv is created on first use under the corpus cache
(`<cache>/keras-venv`, ~1.7 GB, about a minute from PyPI); nothing is installed by hand.

    python bench/corpus_keras.py APP SIZE OUT.onnx     # run inside the exporter venv

Weights are random (`weights=None`), with BatchNorm statistics, scales, shifts and biases
re-randomized before export: left at their initial identity/zero values, tf2onnx drops them
and the graph loses the BatchNorm Mul/Add chains and conv biases a trained model has. The
head gives logits (`classifier_activation=None`). Input NHWC, named `input`, batch 1.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

EXPORTER = ["tensorflow-cpu==2.21.0", "tf2onnx==1.17.0"]


def _venv(cache: Path) -> Path:
    venv = cache / "keras-venv"
    py = venv / "bin" / "python"
    stamp = venv / (".installed-" + hashlib.sha256(" ".join(EXPORTER).encode()).hexdigest()[:8])
    if stamp.exists():
        return py
    print(f"corpus: making the Keras exporter venv {venv} ({' '.join(EXPORTER)})", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *EXPORTER],
                   check=True, timeout=1800)
    stamp.touch()
    return py


def path(spec, cache: Path, build: bool = True) -> Path:
    app, kw = spec.source
    size = kw["input_shape"][0]
    key = hashlib.sha256(repr((app, kw, EXPORTER, Path(__file__).read_bytes())).encode()).hexdigest()[:10]
    out = cache / f"{spec.name}-{key}.onnx"
    if out.exists() or not build:
        return out
    cache.mkdir(parents=True, exist_ok=True)
    py = _venv(cache)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    r = subprocess.run([str(py), __file__, app, str(size), str(out)], capture_output=True, text=True,
                       timeout=1800, env=env)
    if r.returncode != 0 or not out.exists():
        raise RuntimeError(f"exporting {spec.name} ({app}) with tf2onnx failed:\n{r.stderr[-3000:]}")
    return out


def _export(app: str, size: int, out: Path) -> None:
    import keras
    import numpy as np
    import tensorflow as tf
    import tf2onnx
    keras.utils.set_random_seed(0)
    ctor = getattr(keras.applications, app)
    try:
        model = ctor(weights=None, input_shape=(size, size, 3), classifier_activation=None)
    except TypeError:  # an application without that argument
        model = ctor(weights=None, input_shape=(size, size, 3))
    rng = np.random.default_rng(1)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            # weights in Keras's order: gamma (if scale), beta (if center), moving mean, var
            kinds = (["gamma"] if layer.scale else []) + (["beta"] if layer.center else []) + ["mean", "var"]
            make = {"gamma": lambda s: 1 + 0.1 * rng.standard_normal(s), "beta": lambda s: 0.1 * rng.standard_normal(s),
                    "mean": lambda s: 0.1 * rng.standard_normal(s), "var": lambda s: 1 + 0.1 * rng.random(s)}
            layer.set_weights([make[k](w.shape).astype("float32") for k, w in zip(kinds, layer.get_weights())])
        elif getattr(layer, "bias", None) is not None:
            layer.bias.assign((0.01 * rng.standard_normal(layer.bias.shape)).astype("float32"))
    spec = (tf.TensorSpec((1, size, size, 3), tf.float32, name="input"),)
    tmp = out.with_name(out.name + ".part.onnx")
    tf2onnx.convert.from_keras(model, input_signature=spec, opset=17, output_path=str(tmp))
    os.replace(tmp, out)


if __name__ == "__main__":
    _export(sys.argv[1], int(sys.argv[2]), Path(sys.argv[3]))
