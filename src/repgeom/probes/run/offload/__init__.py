"""Probes off the training clock (``probe.offload``; docs/probing.md): `training_side` and
`snapshots` (the training process), `follow` (the worker, ``probe.py follow=<run>``)."""
