"""The Hugging Face hub, reached and cached: everything that talks to the hub or keeps its files.

One job per module: `calls` (one retry policy and bounded session for every hub call),
`transfer` (a file's bytes: ranged resume, hash check), `downloads` (a revision's files into a
folder of ours, within a retry budget), `download_folders` (those folders' markers and proofs),
`config_files` (a model's config and tokenizer files, fetched by huggingface_hub itself into the
user's HF cache, within the run's retry budget) and `revisions` (a repository's branches and tags,
listed for trajectories). No module here writes into the user's HF cache by hand: only
huggingface_hub's own ``hf_hub_download`` writes there (issue 48).

The rules that never call the hub live beside this package: `repgeom.models.revision_names`
(which revisions make a training trajectory: names -> steps) and `repgeom.models.weights_rule`
(which weight files a revision needs).

Reading a model once its files are here (families, loading, capture, queries and keys, the
residual stream, windows) is `repgeom.models.hf`'s job.
"""
