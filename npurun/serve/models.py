"""The model repository: the .onnx / .npuir files directly inside MODEL_DIR, one model each,
and the sub-folders holding a generative model (a decoder with its tokenizer: an Optimum
export or onnxruntime-genai builder output, npurun/generate), served on the OpenAI routes
under the folder's name.

    repo = ModelRepository("models/", executor)   # scans and loads every model once
    m = repo.get("espcn_x3")                      # ServeError 404 when there is no such model

A model's name is its file name without the suffix (`espcn_x3.onnx` -> `espcn_x3`), one
version, "1". Names come only from listing the folder: a request's model name is looked up
in that table and never joined to a path, so no name can reach outside MODEL_DIR. Files in
sub-folders, hidden files, names outside [A-Za-z0-9_.-] and symbolic links that point
outside MODEL_DIR are not models. Two files with one name (`m.onnx` and `m.npuir`) make that
model unavailable, with the reason given, rather than one silently winning.

The compiled plan is cached next to the models: an ONNX model's imported graph is saved as
MODEL_DIR/.npurun-cache/NAME-<sha256 of the .onnx, 16 hex>.npuir (+ .weights.npz), written
atomically; the next start reads that instead of importing again, and a changed .onnx gets a
new key (the old plan is removed). A folder the server cannot write just means no cache.
"""
from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import NpurunError
from .protocol import ServeError, kserve_datatype

log = logging.getLogger("npurun.serve")
NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}$")
SUFFIXES = (".onnx", ".npuir")
CACHE_DIR = ".npurun-cache"
VERSION = "1"


@dataclass
class Model:
    name: str
    path: Path
    version: str = VERSION
    graph: object = None
    state: str = "UNAVAILABLE"  # READY | UNAVAILABLE (as Triton's repository index says)
    reason: str = ""
    plan: Path | None = None  # the cached .npuir, when there is one
    extra: dict = field(default_factory=dict)

    @property
    def ready(self) -> bool:
        return self.state == "READY"

    def tensors(self, names) -> list[dict]:
        """[{name, datatype, shape}], unknown dims as -1 (KServe metadata)."""
        out = []
        for n in names:
            v = self.graph.values[n]
            out.append({"name": n, "datatype": kserve_datatype(v.dtype) or v.dtype,
                        "shape": [d if isinstance(d, int) else -1 for d in v.shape]})
        return out

    def metadata(self) -> dict:
        meta = {"name": self.name, "versions": [self.version], "platform": f"npurun_{self.path.suffix[1:]}"}
        if self.ready:
            meta["inputs"] = self.tensors(self.graph.inputs)
            meta["outputs"] = self.tensors(self.graph.outputs)
        return meta


@dataclass
class GenModel:
    """A generative model: a sub-folder of MODEL_DIR, loaded as an npurun.Generator."""
    name: str
    path: Path
    generator: object = None
    state: str = "UNAVAILABLE"
    reason: str = ""
    created: int = 0

    @property
    def ready(self) -> bool:
        return self.state == "READY"


def is_generative(folder: Path) -> bool:
    """Does the folder hold a decoder the generator reads (by its files: genai_config.json or
    an Optimum decoder file)?"""
    from ..generate.model import OPTIMUM_FILES
    return (folder / "genai_config.json").is_file() or any((folder / f).is_file() for f in OPTIMUM_FILES)


class ModelRepository:
    def __init__(self, model_dir, executor, cache: bool = True):
        self.dir = Path(model_dir)
        if not self.dir.is_dir():
            raise NpurunError(f"{self.dir}: no such folder; npurun serve takes a folder of .onnx/.npuir models")
        self.root = self.dir.resolve()
        self.executor = executor
        self.cache = cache
        self.generators: dict[str, GenModel] = {}
        self.models: dict[str, Model] = self._scan()
        for m in self.models.values():
            if not m.reason:
                self._load(m)
        for g in self.generators.values():
            if not g.reason:
                self._load_generator(g)

    def _scan(self) -> dict[str, Model]:
        found: dict[str, Model] = {}
        for p in sorted(self.dir.iterdir()):
            if p.is_dir() and not p.name.startswith(".") and is_generative(p):
                if not NAME.match(p.name) or not p.resolve().is_relative_to(self.root):
                    log.warning("%s: skipped, a bad name or a link outside %s", p, self.dir)
                    continue
                self.generators[p.name] = GenModel(p.name, p)
                continue
            if p.suffix not in SUFFIXES or p.name.startswith(".") or not p.is_file():
                continue
            name = p.name[:-len(p.suffix)]
            if not NAME.match(name):
                log.warning("%s: skipped, a model name must be letters, digits, '_', '.', '-'", p)
                continue
            if not p.resolve().is_relative_to(self.root):
                log.warning("%s: skipped, it links outside %s", p, self.dir)
                continue
            if name in found:
                found[name].reason = f"both {found[name].path.name} and {p.name} are named {name!r}; remove one"
                continue
            found[name] = Model(name, p)
        for name in set(found) & set(self.generators):
            why = f"both {found[name].path.name} and the folder {name}/ are named {name!r}; rename one"
            found[name].reason = self.generators[name].reason = why
        return found

    def _load_generator(self, g: GenModel) -> None:
        from ..generate import Generator
        try:
            g.generator = Generator(g.path, executor=self.executor, name=g.name)
            g.generator.graph.source = f"model {g.name!r}"
            g.state, g.reason, g.created = "READY", "", int(g.path.stat().st_mtime)
        except (NpurunError, OSError) as e:
            g.state, g.reason = "UNAVAILABLE", str(e)
            log.error("model %s: %s", g.name, e)

    def generator(self, name) -> GenModel:
        """The ready generative model `name` (404 unknown, 503 not ready)."""
        g = self.generators.get(name) if isinstance(name, str) else None
        if g is None:
            raise ServeError(404, f"unknown model {name!r}; the generative models are "
                                  f"{', '.join(map(repr, self.generators)) or 'none'}")
        if not g.ready:
            raise ServeError(503, f"model {name!r} is not ready: {g.reason}")
        return g

    def _load(self, m: Model) -> None:
        try:
            g, m.plan = self._graph(m)
            g.source = f"model {m.name!r}"  # error messages name the model, not the server's paths
            for n in g.inputs + g.outputs:
                if kserve_datatype(g.values[n].dtype) is None:
                    raise NpurunError(f"tensor {n!r} has dtype {g.values[n].dtype}, which KServe v2 cannot carry")
            self.executor.compile(g)
            m.graph, m.state, m.reason = g, "READY", ""
        except (NpurunError, OSError) as e:
            m.state, m.reason = "UNAVAILABLE", str(e)
            log.error("model %s: %s", m.name, e)

    def _graph(self, m: Model):
        from ..frontend import load
        if m.path.suffix != ".onnx" or not self.cache:
            return load(m.path), None
        from ..ir.io import load_npuir, save, weights_path_for
        digest = hashlib.sha256(m.path.read_bytes()).hexdigest()[:16]
        cdir = self.dir / CACHE_DIR
        plan = cdir / f"{m.name}-{digest}.npuir"
        if plan.exists():
            try:
                return load_npuir(plan), plan
            except NpurunError as e:  # a damaged plan: import again and rewrite it
                log.warning("model %s: cached plan unusable (%s); importing again", m.name, e)
        g = load(m.path)
        try:
            cdir.mkdir(exist_ok=True)
            for old in cdir.glob(f"{m.name}-*.npuir"):
                if re.fullmatch(r"[0-9a-f]{16}", old.name[len(m.name) + 1:-len(".npuir")]) and old != plan:
                    old.unlink(missing_ok=True)
                    weights_path_for(old).unlink(missing_ok=True)
            save(g, plan)
            g = load_npuir(plan)  # serve what the cache holds, so a cold and a warm start agree
        except OSError as e:
            log.warning("model %s: cannot cache its plan in %s (%s)", m.name, cdir, e)
            return g, None
        return g, plan

    # --- lookups
    def get(self, name: str, version: str | None = None, ready: bool = True) -> Model:
        m = self.models.get(name)
        if m is None:
            raise ServeError(404, f"unknown model {name!r}; the models are "
                                  f"{', '.join(map(repr, self.models)) or 'none'}")
        if version not in (None, "", m.version):
            raise ServeError(404, f"model {name!r} has no version {version!r}; its version is {m.version!r}")
        if ready and not m.ready:
            raise ServeError(503, f"model {name!r} is not ready: {m.reason}")
        return m

    @property
    def ready(self) -> bool:
        return all(m.ready for m in self.models.values()) and all(g.ready for g in self.generators.values())

    def index(self) -> list[dict]:
        return [{"name": m.name, "version": m.version, "state": m.state, "reason": m.reason}
                for m in self.models.values()] + [
               {"name": g.name, "version": VERSION, "state": g.state, "reason": g.reason, "type": "generative"}
               for g in self.generators.values()]
