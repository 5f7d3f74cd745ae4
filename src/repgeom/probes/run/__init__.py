"""Running probes: ``probe.py`` (`runner`), what a job names (`sources`), its streamed loop over
hub revisions and checkpoints (`trajectory`, with `schedule` thinning the steps and `shards`
splitting them over jobs), compare mode (`compare`), the training callback (`callback`) and the
recorder it shares with the offloaded worker (`recorder`, `offload/`).

A change to when, where or over what the probes run lands here. Imports `core` and `report`.
"""
