"""What a finished (or growing) probe table says: layer means (`aggregate`), the phases of
the intrinsic dimension and the noise rule behind them (`phases`, `phase_report`, `noise`), Godey
et al.'s drift/cosine test (`drift_cosine`), the console summary (`console`), W&B charts and
the sink that writes rows and figures (`wandb_charts`, `sink`), the figures (`plots/`) and the
cross-model survey (`survey`).

A change to how results are summarised, drawn or logged lands here. Imports `core` only.
"""
