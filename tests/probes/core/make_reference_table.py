"""Write `data/reference_table.csv`: every number of the probe on a fixed tiny model.

Run once with the code BEFORE the metric catalogue (commit 25c2e81) and committed; the test
`test_catalogue.py::test_probe_numbers_unchanged_by_the_catalogue` probes the same model on the
same probe set with today's code and asserts every row of this file is reproduced, to
float32 rounding (the file was written on one CPU; another CPU rounds differently).

    PYTHONPATH=src python tests/probes/core/make_reference_table.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch

from repgeom.models.gpt import GPT, GPTConfig
from repgeom.probes.core.measure import ProbeSettings, measure
from repgeom.probes.core.sampling import choose_positions

OUT = Path(__file__).parent / "data" / "reference_table.csv"
SETTINGS = dict(max_order=8, state_batch_size=128, distributions=True, distribution_samples=300)


def tiny_model() -> GPT:
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=40, block_size=32, n_layer=2, n_head=2, n_embd=16)).eval()


def windows() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 40, (96, 32), generator=generator)
    positions = choose_positions(torch.ones(ids.shape, dtype=torch.bool), 4, 0)
    return ids, positions


def captures(model, ids, positions, attention):
    for start in range(0, len(ids), 16):
        capture = model.capture(ids[start : start + 16], attention=attention)
        if positions is not None:
            capture.valid = positions[start : start + 16]
        yield capture


def reference_frame() -> pd.DataFrame:
    model, (ids, positions) = tiny_model(), windows()
    with torch.no_grad():
        out = measure(
            captures(model, ids, positions, False),
            captures(model, ids[:4], None, True),
            ProbeSettings(**SETTINGS),
        )
    return pd.DataFrame(out.rows)


if __name__ == "__main__":
    OUT.parent.mkdir(exist_ok=True)
    reference_frame().to_csv(OUT, index=False, float_format="%.17g")
    print(f"wrote {OUT}")
