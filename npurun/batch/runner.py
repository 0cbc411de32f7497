"""Running a job, here or on Ray: claim the output folder, skip what is done, run the rest, keep
the manifest and the progress bar, and report every failure by name at the end."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .job import Item, Manifest, Spec, claim, clean_partials, row, sha256_file


@dataclass
class Summary:
    total: int
    written: int = 0
    skipped: int = 0
    failed: list[tuple[str, str]] = field(default_factory=list)  # (input, error)
    seconds: float = 0.0
    manifest: str = ""

    @property
    def rate(self) -> float:
        """Items computed per second (skipped ones left out)."""
        return (self.written + len(self.failed)) / self.seconds if self.seconds > 0 else 0.0


def run_job(spec: Spec, items: list[Item], outdir, fingerprint: dict, *, graph=None, ray: str | None = None,
            workers: int | None = None, resource: str | None = None, progress: bool = True,
            on_row=None) -> Summary:
    """Run the items whose outputs are missing; `ray` (None: here) is a Ray address, `local`
    or `auto`. Interrupted (Ctrl-C, a kill), it leaves complete outputs only, and the next run
    with the same arguments goes on from there."""
    outdir = Path(outdir)
    claim(outdir, fingerprint)
    clean_partials(outdir)
    manifest = Manifest(outdir)
    summary = Summary(total=len(items), manifest=str(manifest.path))
    todo = []
    for it in items:
        if os.path.exists(it.output):
            old = manifest.earlier(it)
            sha = old["sha256"] if old and old.get("status") in ("ok", "skipped") and old.get("sha256") \
                else sha256_file(it.output)
            manifest.record(row(it, "skipped", sha256=sha, worker=(old or {}).get("worker", "")))
            summary.skipped += 1
        else:
            todo.append(it)
    bar = _Progress(len(items), summary.skipped, enabled=progress)

    def on_result(r: dict) -> None:
        manifest.record(r)
        if r["status"] == "error":
            summary.failed.append((r["input"], r["error"]))
        else:
            summary.written += 1
        bar.advance(len(summary.failed))
        if on_row is not None:
            on_row(r)

    t0 = time.perf_counter()
    try:
        if todo and ray is None:
            from .pipeline import run_items
            from .work import Worker
            worker = Worker(spec, graph)
            try:
                run_items(worker, todo, on_result, io_threads=spec.io_threads, who=f"{os.getpid()}@local")
            finally:
                worker.close()
        elif todo:
            from .ray_job import run_on_ray
            run_on_ray(spec, todo, on_result, address=ray, workers=workers, resource=resource)
    finally:
        summary.seconds = time.perf_counter() - t0
        bar.close()
        clean_partials(outdir)  # what a killed Ray worker left (none of the job's workers runs now)
        manifest.finish(items)
    return summary


class _Progress:
    """One bar on a terminal (items, items/s, ETA, failures); on a pipe a line every 30 s."""

    def __init__(self, total: int, done: int, enabled: bool):
        self.total, self.done, self.start_done = total, done, done
        self.t0 = self.last_line = time.monotonic()
        self.bar = None
        self.enabled = enabled and total > done
        if self.enabled and sys.stderr.isatty():
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                       TimeRemainingColumn)
            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                TextColumn("{task.fields[rate]}"), TextColumn("ETA"), TimeRemainingColumn(),
                                TextColumn("{task.fields[failed]}"), console=Console(stderr=True))
            self.bar.start()
            self.task = self.bar.add_task("items", total=total, completed=done, rate="", failed="")

    def advance(self, failed: int) -> None:
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        rate = (self.done - self.start_done) / max(now - self.t0, 1e-9)
        if self.bar is not None:
            self.bar.update(self.task, advance=1, rate=f"{rate:.2f} items/s",
                            failed=f"{failed} failed" if failed else "")
        elif now - self.last_line >= 30 and self.done < self.total:
            self.last_line = now
            eta = (self.total - self.done) / rate if rate > 0 else float("inf")
            print(f"npurun: {self.done}/{self.total} items, {rate:.2f} items/s, ETA {eta:.0f} s"
                  + (f", {failed} failed" if failed else ""), file=sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()
