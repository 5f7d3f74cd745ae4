"""repgeom's Lightning callbacks: the adapters between a Lightning `Trainer` and repgeom.

A module here is one `lightning.pytorch.callbacks.Callback` (or a subclass of one of
Lightning's), named in conf/callbacks/*.yaml, built on Lightning's public API only
(tests/test_private_names.py): the checkpoint policy (its `CheckpointIO` plugin beside the
callbacks), the throughput monitor, the progress bar and the model summary. The probe callbacks
(repgeom.probes.run.callback and offload's training side) stay with the probes they run: this
floor sits below repgeom.probes and imports nothing of it. What a callback measures
or decides lives in the floors below (repgeom.models, repgeom.peak_flops); a callback only
reads the trainer's state at its hooks and hands it on.
"""
