"""The alpha_req catalogue entry: its two rows are the mean over the probe's batches of
`repgeom.metrics.alpha_req`, in the training default set."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from repgeom import metrics
from repgeom.models.capture import Capture
from repgeom.probes.core import catalogue
from repgeom.probes.core.measure import ProbeSettings, measure


def test_alpha_req_rows_are_the_mean_over_batches() -> None:
    generator = torch.Generator().manual_seed(0)
    X = torch.randn(1, 600, 64, generator=generator) * torch.arange(1, 65) ** -0.6
    settings = ProbeSettings(metrics=["alpha_req", "effective_rank"], state_batch_size=200)
    frame = pd.DataFrame(measure([Capture(hidden=[X, 2 * X])], [], settings).rows)
    for layer in (0, 1):
        batches = [X[0][i] for i in metrics.batch_indices(600, 200, 0)]
        results = [metrics.alpha_req(b) for b in batches]
        rows = frame.loc[frame["layer"] == layer].set_index("metric")
        assert rows.loc["alpha_req", "value"] == pytest.approx(
            np.mean([r.alpha for r in results]), rel=1e-12)
        assert rows.loc["alpha_req", "std"] == pytest.approx(
            np.std([r.alpha for r in results]), rel=1e-9)
        assert rows.loc["alpha_req_r2", "value"] == pytest.approx(
            np.mean([r.r2 for r in results]), rel=1e-12)
        assert 0.3 < rows.loc["alpha_req", "value"] < 2.0  # a decaying spectrum
    assert "alpha_req" in {m.name for m in catalogue.resolve(["default"])}
    assert catalogue.label("alpha_req_r2") == "alpha-ReQ fit R\u00b2"


def test_too_narrow_states_skip_alpha_req_with_a_warning() -> None:
    X = torch.randn(1, 300, 8, generator=torch.Generator().manual_seed(0))
    out = measure([Capture(hidden=[X])], [], ProbeSettings(metrics=["alpha_req", "rankme"]))
    assert {r["metric"] for r in out.rows} == {"rankme"}
    assert any("alpha_req skipped at layer 0" in w and "positive" in w for w in out.warnings)
