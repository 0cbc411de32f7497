"""Batch jobs: a model over a folder of photos or a dataset of tensors, here or on Ray.

    job.py       items (one input -> one output at a fixed path), the job file, the manifest
    work.py      a worker: the compiled model and an item's stages (load, compute, store)
    pipeline.py  one worker's loop, with decode and encode overlapping the compute
    runner.py    a whole job: skip what is done, run the rest here or on Ray, report
    ray_job.py   the same job on Ray Data (one worker per actor)

The CLI is `npurun upscale DIR -o OUTDIR` and `npurun batch MODEL INPUTS -o OUTDIR`
(npurun/commands/batch.py); docs/scale-out.md explains the design.
"""
