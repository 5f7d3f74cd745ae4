"""Probes off the training clock (``probe.offload``): what crosses from the training process to
a probe worker. `training_side`: what the training callback does (rank 0 starts the snapshots and
its own worker, and ends them); `snapshots`: the weights at each probe step, written in the
background, the heartbeat and done marker, the files' layout; `follow`: the worker
(``probe.py follow=<run>``) that probes them as they appear. Both record through
`repgeom.probes.run.recorder`, as the in-process probe does."""
