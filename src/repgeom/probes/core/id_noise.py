"""The standard error of the TwoNN and MLE rows, from noise batches (issue 37).

The value of a TwoNN, GRIDE or MLE row is the mean over the estimator batches of 4,096 states
(Razzhigaev et al. 2023, section 2.2), and its ``std`` the spread over those batches: with the
default 8,192 states that is 2 batches, a standard deviation with one degree of freedom, too weak
to decide anything (`repgeom.probes.report.turn_test`). Here the same states are also cut into
``noise_splits`` times as many *noise batches* (each value batch split in ``noise_splits``, from
the same permutation: `repgeom.metrics.intrinsic_dimension.knn_batches.batch_indices`), the
estimator is run on each, and the row gets

* ``se``: the standard error of ``value``, ``sd / √n`` over the ``n`` noise batches (``sd`` with
  ``ddof = 1``). An estimator's variance goes as one over its batch size (the TwoNN maximum
  likelihood estimate's is ``d² / N``, Facco et al. 2017), so the mean of ``n`` estimates on
  batches of ``N / n`` states has about the variance of the value, the mean over the value's
  batches of the same ``N`` states; benchmarks/README.md ("Phase calibration") checks that
  assumption against the spread of the value over independent sets (it holds for TwoNN and the
  MLE, not for GRIDE: `NOISE_MAX_ORDER`);
* ``se_df``: ``n − 1``, its degrees of freedom;
* ``n_batches``: the number of value batches (what ``std`` is the spread of).

The noise batches' *means* are not used: TwoNN reads low on small batches (benchmarks/README.md,
"Probe protocol"), which moves the mean, not the spread.

The values are untouched. With ``settings.noise_splits`` 0 or 1, or noise batches below
`MIN_NOISE_BATCH` states, ``se`` is NaN (the phase finder then reads ``std`` and ``n_batches``).
"""

from __future__ import annotations

import math

import numpy as np

from repgeom import metrics

MIN_NOISE_BATCH = 256
"""Fewest states in a noise batch: GRIDE up to order 64 needs more than 64 distinct points, and
below a few hundred points TwoNN's bias is no longer small against its spread."""
NOISE_MAX_ORDER = 2
"""GRIDE's highest order on the noise batches: the lowest, since no GRIDE row gets an ``se``.
Measured on manifolds of known dimension (benchmarks/README.md, "Phase calibration"), GRIDE k16's
noise-batch ``se`` came out 1.2-1.7 times smaller than the spread of its value: at order 16 a
batch of 512 reads a length scale about 8^(1/d) times that of a batch of 4,096, so its variance
is not the value's scaled by the batch size. A standard error that small would let false turns
through, so GRIDE rows keep ``std`` and ``n_batches`` only (undecided with one seed at the
default protocol; with several seeds their disagreement is the noise,
`repgeom.probes.report.turn_test`)."""
NOISE_COLUMNS = ("n_batches", "se", "se_df")
"""The table columns this module fills (`repgeom.probes.core.table.NOISE_COLUMNS`)."""


def noise_batch_size(n_states: int, state_batch_size: int, noise_splits: int) -> int | None:
    """The noise batches' size, or None where they are off or too small (module doc)."""
    if noise_splits < 2:
        return None
    size = min(state_batch_size, n_states) // noise_splits
    return size if size >= MIN_NOISE_BATCH else None


def standard_errors(X, settings, value_batches: int) -> dict[str, dict]:
    """``{row name: {"n_batches", "se", "se_df"}}`` for the TwoNN and MLE rows of
    `repgeom.probes.core.catalogue`'s intrinsic-dimension entry on the states `X`; empty where
    the noise batches are off or too small."""
    size = noise_batch_size(X.shape[0], settings.state_batch_size, settings.noise_splits)
    if size is None:
        return {}
    result = metrics.intrinsic_dimension(
        X, discard_fraction=settings.discard_fraction, batch_size=size,
        max_order=min(settings.max_order, NOISE_MAX_ORDER),
        near_duplicate_threshold=settings.near_duplicate_threshold,
        seed=settings.seed,
    )
    n = result.twonn.n_batches
    if n < 2:
        return {}

    def noise(std: float) -> dict:  # std: population std over the n noise batches
        # sd with ddof 1 is std · √(n / (n − 1)); over √n: std / √(n − 1)
        return {"n_batches": value_batches, "se": float(std) / math.sqrt(n - 1), "se_df": n - 1}

    return {"twonn": noise(result.twonn.dimension_std),
            "twonn_mle": noise(result.twonn.mle_std),
            "mle_dimension": noise(result.mle.dimension_std)}


def attach(rows: list[tuple], noise: dict[str, dict], value_batches: int) -> list[tuple]:
    """`rows` as ``(name, value, std, note, columns)``: each row of `noise` gets its columns;
    a row whose value is NaN (the copies guard) gets none; the other rows with a batch std get
    ``n_batches``."""
    out = []
    for name, value, std, *more in rows:
        note = more[0] if more else ""
        columns = noise.get(name, {}) if np.isfinite(value) else {}
        if not columns and np.isfinite(std):
            columns = {"n_batches": value_batches}
        out.append((name, value, std, note, columns))
    return out
