"""repgeom's Lightning callbacks: the adapters between a Lightning `Trainer` and repgeom.

A module here is one `lightning.pytorch.callbacks.Callback` (or a subclass of one of
Lightning's), named in conf/callbacks/*.yaml, built on Lightning's public API only
(tests/test_private_names.py): the throughput monitor, the progress bar and the model summary;
the checkpoint policy and the probe-offload callback belong here too. What a callback measures
or decides lives in the floors below (repgeom.models, repgeom.peak_flops); a callback only
reads the trainer's state at its hooks and hands it on.
"""
