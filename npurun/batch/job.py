"""A batch job on paper: its items (one input -> one output at a fixed path), the job file that
ties an output folder to one model and one set of options, and the manifest.

Why fixed output paths: an output is written atomically (util.atomic_write), so a file that
exists is complete. A rerun skips every item whose output exists — after a crash, a killed
driver or a Ray worker replaying a batch — and an item can never be written twice to two places.
"""
from __future__ import annotations

import glob
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError
from ..util import atomic_write

JOB_FILE = ".npurun-job.json"
MANIFEST = "manifest.jsonl"
IMAGE_EXTS = frozenset({".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", ".webp"})
TENSOR_EXTS = frozenset({".npy", ".npz", ".parquet"})
_GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class Item:
    """One unit of work. `part` is the row group of a Parquet input (None for a file)."""
    input: str
    output: str
    part: int | None = None

    @property
    def label(self) -> str:
        return self.input if self.part is None else f"{self.input}#rowgroup={self.part}"


@dataclass(frozen=True)
class Spec:
    """What a worker needs to run a job's items: picklable, so a Ray actor gets the same one."""
    kind: str                      # "upscale" (images) or "tensors" (.npy/.npz/Parquet)
    model: str                     # the model file (.onnx / .npuir), absolute
    device: str = "cpu"
    threads: int | None = None     # compute threads per worker (None: all cores)
    precision: str = "fp32"
    calibrate: str | None = None
    scale: int = 3                 # upscale: the factor the model must have
    png_level: int = 2             # upscale: zlib level of PNG outputs (pixels do not depend on it)
    column: str | None = None      # tensors: the Parquet column fed to the model
    input_name: str | None = None  # tensors: the model input fed (default: its only input)
    io_threads: int = 2            # decode/encode threads per worker

    def fingerprint(self, output_format: str) -> dict:
        """What decides the outputs' values. A resume with a different fingerprint would mix
        two jobs' outputs in one folder and is refused. Device, threads and PNG level are left
        out: they change speed and file size, not the values (within the backends' rounding)."""
        return {"kind": self.kind, "model_sha256": _model_digest(Path(self.model)), "precision": self.precision,
                "calibrate": self.calibrate, "scale": self.scale if self.kind == "upscale" else None,
                "column": self.column, "input_name": self.input_name, "output_format": output_format}


def _model_digest(path: Path) -> str:
    h = hashlib.sha256()
    files = [path]
    if path.suffix == ".npuir":
        from ..ir.io import weights_path_for as weights_path
        files.append(weights_path(path))
    for f in files:
        if f.is_file():
            with open(f, "rb") as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# ---------------------------------------------------------------- planning

def expand(inputs: list[str], exts: frozenset[str], outdir: Path) -> list[tuple[Path, Path]]:
    """(input file, its output path relative to OUTDIR, before the suffix is set) for every
    argument: a folder gives the files under it with one of `exts` (recursively, hidden files
    and OUTDIR itself left out, the folder's layout kept); a glob gives its matches; a file is
    taken as it is. A missing file or a glob matching nothing is an error before any work."""
    out_root = outdir.resolve()
    found: list[tuple[Path, Path]] = []
    for arg in inputs:
        p = Path(arg)
        if p.is_dir():
            files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in exts
                           and not any(part.startswith(".") for part in f.relative_to(p).parts)
                           and not f.resolve().is_relative_to(out_root))
            found += [(f, f.relative_to(p)) for f in files]
        elif p.is_file():
            found.append((p, Path(p.name)))
        elif _GLOB_CHARS & set(arg):
            matches = sorted(Path(m) for m in glob.glob(arg, recursive=True) if Path(m).is_file())
            if not matches:
                raise InputError(f"{arg}: the pattern matches no file")
            found += [(m, Path(m.name)) for m in matches if not m.resolve().is_relative_to(out_root)]
        else:
            raise InputError(f"{arg}: no such file or folder")
    if not found:
        raise InputError(f"no input files with a suffix among {', '.join(sorted(exts))} in {' '.join(inputs)}")
    return found


def plan(inputs: list[str], outdir: str | os.PathLike, *, kind: str, suffix: str | None = None,
         parquet_parts=None) -> list[Item]:
    """The job's items, in a fixed order. Images -> OUTDIR/REL.SUFFIX; .npy/.npz ->
    OUTDIR/REL.SUFFIX (.npy for one model output, .npz for several); a Parquet table -> one
    item per row group, OUTDIR/REL/part-NNNNN.parquet (`parquet_parts(path)` counts them).
    Two inputs that would write one output are an error that names both."""
    outdir = Path(outdir)
    exts = IMAGE_EXTS if kind == "upscale" else TENSOR_EXTS
    items: list[Item] = []
    seen: dict[Path, str] = {}
    for src, rel in expand(inputs, exts, outdir):
        if kind == "tensors" and src.suffix.lower() == ".parquet":
            targets = [(outdir / rel.with_suffix("") / f"part-{k:05d}.parquet", k) for k in range(parquet_parts(src))]
        else:
            targets = [(outdir / rel.with_suffix(suffix), None)]
        for out, part in targets:
            if out in seen:
                raise InputError(f"{src} and {seen[out]} would both write {out}; give them separate folders")
            seen[out] = str(src)
            items.append(Item(str(src), str(out), part))
    return items


# ---------------------------------------------------------------- the job file and the manifest

def claim(outdir: str | os.PathLike, fingerprint: dict) -> None:
    """Tie OUTDIR to this job, or check that it already is: a folder holding another job's
    outputs (another model, precision or format) is refused rather than mixed."""
    outdir = Path(outdir)
    if outdir.exists() and not outdir.is_dir():
        raise InputError(f"-o {outdir}: exists and is not a folder")
    outdir.mkdir(parents=True, exist_ok=True)
    f = outdir / JOB_FILE
    if f.exists():
        try:
            old = json.loads(f.read_text(encoding="utf-8"))["fingerprint"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise InputError(f"{f}: unreadable job file ({e}); delete it to start over") from None
        diff = sorted(k for k in set(old) | set(fingerprint) if old.get(k) != fingerprint.get(k))
        if diff:
            what = ", ".join(f"{k}: {old.get(k)!r} then, {fingerprint.get(k)!r} now" for k in diff)
            raise InputError(f"{outdir}: holds the outputs of a job with other options ({what}); "
                             f"choose another -o, or delete {f} and the outputs to start over")
        return
    atomic_write(f, (json.dumps({"fingerprint": fingerprint}, indent=1) + "\n").encode())


def clean_partials(outdir: str | os.PathLike) -> int:
    """Remove the temporary files of writes that a killed process never finished (atomic_write
    names them `.NAME.XXXX.tmp`); run only when no worker of the job is running."""
    n = 0
    for f in Path(outdir).rglob(".*.tmp"):
        try:
            f.unlink()
            n += 1
        except FileNotFoundError:
            pass
    return n


class Manifest:
    """OUTDIR/manifest.jsonl: one row per input (input, output, status, sha256, error, worker).

    Rows are appended as items finish (a killed job keeps what it did; a torn last line is
    ignored on the next read) and the file is rewritten atomically at the end with one row
    per item of the job, in the job's order."""

    def __init__(self, outdir: str | os.PathLike):
        self.path = Path(outdir) / MANIFEST
        self.rows: dict[str, dict] = {}
        if self.path.exists():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                    self.rows[row["input"]] = row
                except (ValueError, KeyError, TypeError):
                    continue
        self._fh = open(self.path, "a", encoding="utf-8")

    def earlier(self, item: Item) -> dict | None:
        return self.rows.get(item.label)

    def record(self, row: dict) -> None:
        self.rows[row["input"]] = row
        self._fh.write(json.dumps(row) + "\n")
        self._fh.flush()

    def finish(self, items: list[Item]) -> None:
        self._fh.close()
        body = "".join(json.dumps(self.rows[it.label]) + "\n" for it in items if it.label in self.rows)
        atomic_write(self.path, body.encode())


def row(item: Item, status: str, sha256: str = "", error: str = "", worker: str = "") -> dict:
    """A status row: `ok` (written now), `skipped` (its output was there already), `error`."""
    return {"input": item.label, "output": item.output, "status": status, "sha256": sha256,
            "error": error, "worker": worker}


__all__ = ["Item", "Spec", "Manifest", "plan", "claim", "clean_partials", "row", "sha256_file"]
