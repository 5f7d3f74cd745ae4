"""Self-contained analyses with their own command lines (``python -m repgeom.analyses.<name>``).

- ``distributions``: activation laws and secondary modes per layer and label group
  ("Beyond Gaussian", papers/004).
- ``distinctiveness``: subject/attribute distinctiveness of pooled sentence states (papers/004).
- ``similarity``: token x token cosine within a text, pooled cosine of text pairs (papers/000).
- ``godey``: drift norm against mean cosine across layers, Spearman and Pearson (papers/003);
  the one analysis the probe pipeline calls (probe.py's ``drift_cosine.csv``, the report).
- ``subjects``: models (Hugging Face or our checkpoints) as one interface; tokenizer checks.
- ``example_data``: a small templated subject x attribute data set.

They read models through `repgeom.probes.hf` and `CharLM`, and never touch the probe pipeline.
"""
