"""The probe's causal windows, cut after their last sampled position, give the table of whole
windows (`GPT.capture_positions` against `gpt_captures`, in the same process)."""

import numpy as np
import pytest
import torch

from repgeom.models.gpt import GPT, GPTConfig
from repgeom.probes.core.measure import ProbeSettings, measure_states
from repgeom.probes.core.sampling import choose_positions
from repgeom.probes.core.targets import gpt_captures


@pytest.mark.parametrize("causal", [True, False])
def test_cut_windows_give_the_table_of_whole_windows(causal: bool) -> None:
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=60, block_size=64, n_layer=2, n_head=2, n_embd=32,
                          causal=causal)).eval()
    windows = torch.randint(0, 60, (160, 64), generator=torch.Generator().manual_seed(1))
    positions = choose_positions(torch.ones(windows.shape, dtype=torch.bool), 4, seed=0)
    settings = ProbeSettings(state_batch_size=256, max_order=8)
    with torch.no_grad():
        whole = measure_states(
            gpt_captures(model, windows, positions, batch_size=16, attention=False), settings
        )
        cut = measure_states([model.capture_positions(windows, positions, batch_size=16)],
                             settings)
    assert [(r["layer"], r["metric"]) for r in whole.rows] == [
        (r["layer"], r["metric"]) for r in cut.rows
    ]
    assert len(whole.rows) > 30 and whole.layer_names[-1] == "final_norm"
    # The states differ by float32 rounding (another batch shape); the metrics of 640 states
    # pass that on, amplified at most by the estimators' conditioning: 1e-5 relative.
    np.testing.assert_allclose([r["value"] for r in cut.rows], [r["value"] for r in whole.rows],
                               rtol=1e-5, atol=1e-7)
