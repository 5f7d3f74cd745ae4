"""Self-contained analyses of a model on texts, each run by ``repgeom-<name>`` (`repgeom.cli`).

- ``distributions``: activation laws and secondary modes per layer and label group
  ("Beyond Gaussian", papers/004).
- ``distinctiveness``: subject/attribute distinctiveness of pooled sentence states (papers/004).
- ``similarity``: token x token cosine within a text, pooled cosine of text pairs (papers/000).
- ``qk_projection``: queries and keys of every checkpoint of a run in one SVD projection
  (papers/003, Figs. 11-12); also ``probe.py run=... qk_projection=true``.
- ``scores``: pre-softmax attention scores per block, quantiles and row/sequence extremes
  (papers/003, Figs. 7 and 10).
- ``subjects``: models (Hugging Face or our checkpoints) as one interface; tokenizer checks.
- ``example_data``: a small templated subject x attribute data set.

They sit above the probe pipeline: they read models through `repgeom.models.hf` and `CharLM`
(``qk_projection``: a run's checkpoints and the training probe's windows) and use only the
pipeline's public names; the pipeline never imports them (``probe.py``'s ``qk_projection=`` and
``labels.csv=`` are dispatched by `repgeom.analyses.probe_extras` from the entry point). Godey et
al.'s drift/cosine correlation, which every probe run writes, is
`repgeom.probes.report.drift_cosine`.
"""
