"""What one probe is: the metric catalogue, the probe's options (`spec`), the probe set
(`sampling`, `texts`), what is probed (`targets`: our checkpoints and Hugging Face models), the
measurement (`measure`), pairwise similarity of state sets (`similarity`) and the tidy table
(`table`).

A change to *what* is measured or *how* lands here: a new metric is its function in
`repgeom.metrics` and one entry in `catalogue`; a new probe option is a field of
`spec.ProbeSpec` / `measure.ProbeSettings`. Nothing here imports `report` or `run`.
"""
