"""The intrinsic-dimension entries of the catalogue (`repgeom.probes.core.catalogue`): TwoNN,
GRIDE and the MLE from one neighbour search per batch, the scale profile, and the guard that
sets them NaN where the states are mostly copies."""

from __future__ import annotations

import math
import re
import weakref

import numpy as np

from repgeom import metrics
from repgeom.metrics.intrinsic_dimension.mle import local_mle
from repgeom.probes.core import id_noise

ID_GUARDED = re.compile(r"twonn|twonn_mle|twonn_llm_microscope|gride_k\d+|mle_dimension|"
                        r"twonn_dec\d+|id_plateau(_lo|_hi)?")
"""The intrinsic-dimension readings that `ProbeSettings.max_copy_share` sets to NaN."""


def _copy_share(result, n: int) -> float:
    """Share of the ``n`` states that are exact copies (merged before the search) or have a
    near-copy (`metrics.near_duplicate_share`, a share of the distinct points)."""
    twonn = result.twonn
    return (twonn.n_duplicates + result.near_duplicate_share * twonn.n_points) / n


def _guard(rows: list[tuple], share: float, limit: float) -> list[tuple]:
    """Every ID reading of `rows` NaN with its reason where the copy share exceeds `limit`."""
    if not share > limit:
        return rows
    note = (f"copies: {share:.0%} of the states are copies or near-copies "
            f"(max_copy_share {limit:.0%}); the estimators would read the jitter inside clumps")
    return [(row[0], math.nan, math.nan, note) if ID_GUARDED.fullmatch(row[0]) else row
            for row in rows]


_LAST_SEARCH: list = []
"""(weak reference to the states, options, result) of the last `_id_search`:
``intrinsic_dimension`` runs before
``id_scales`` on the same layer's tensor (catalogue order), which then reuses its neighbour
search (and so reads GRIDE's scales from the very search of the ``gride_k`` rows) instead of
repeating it. The reference is weak, so the states are not kept alive by it."""


def _id_search(X, settings, *, reuse: bool = False):
    options = (settings.discard_fraction, min(settings.state_batch_size, X.shape[0]),
               settings.max_order, settings.near_duplicate_threshold, settings.seed)
    if reuse and _LAST_SEARCH and _LAST_SEARCH[0]() is X and _LAST_SEARCH[1] == options:
        result = _LAST_SEARCH[2]
    else:
        discard_fraction, batch_size, max_order, threshold, seed = options
        result = metrics.intrinsic_dimension(
            X, discard_fraction=discard_fraction, batch_size=batch_size, max_order=max_order,
            near_duplicate_threshold=threshold, seed=seed,
        )
    _LAST_SEARCH[:] = [] if reuse else [weakref.ref(X), options, result]
    return result


_LOCAL_IDS: list = []
"""(weak reference to the states, each state's local ID) of the last `_intrinsic_dimension`
with ``settings.per_token``: `local_ids` hands them to `measure` after the layer's metrics."""


def local_ids(X) -> np.ndarray | None:
    """Each state's local ID (Levina-Bickel MLE on its k = 20 neighbours of the shared search,
    `metrics.intrinsic_dimension.mle.local_mle`) of the layer `X` just measured, or None."""
    if _LOCAL_IDS and _LOCAL_IDS[0]() is X:
        return _LOCAL_IDS[1]
    return None


def _intrinsic_dimension(X, settings) -> list[tuple]:
    """TwoNN, GRIDE and the Levina-Bickel MLE from one exact neighbour search per batch; NaN
    with a note where copies exceed ``settings.max_copy_share`` (`_guard`); each state's local
    MLE kept for `local_ids` where ``settings.per_token`` asks, behind the same guard (all NaN
    where the layer's estimators are: a local ID inside a clump of copies reads the jitter)."""
    result = _id_search(X, settings)
    share = _copy_share(result, X.shape[0])
    if getattr(settings, "per_token", False):
        local = (np.full(X.shape[0], math.nan) if share > settings.max_copy_share
                 else local_mle(result.neighbours, result.mle.k, X.shape[0]))
        _LOCAL_IDS[:] = [weakref.ref(X), local]
    else:
        _LOCAL_IDS[:] = []
    twonn = result.twonn
    spread = 1.0 if twonn.n_batches > 1 else math.nan  # one batch has no spread to report
    if settings.twonn_convention == "llm_microscope":  # the authors' fit, on the same batches
        batch = min(settings.state_batch_size, X.shape[0])
        dims = [metrics.twonn_authors(X[index.to(X.device)]).dimension
                for index in metrics.batch_indices(X.shape[0], batch, settings.seed)]
        rows = [("twonn_llm_microscope", float(np.mean(dims)), float(np.std(dims)) * spread)]
    else:
        rows = [("twonn", twonn.dimension, twonn.dimension_std * spread),
                ("twonn_mle", twonn.mle, twonn.mle_std * spread)]
    rows.append(("duplicates", twonn.n_duplicates, math.nan))
    gride = result.gride
    for order, dim, std in zip(gride.orders, gride.dimension, gride.dimension_std, strict=True):
        rows.append((f"gride_k{order}", dim, std * spread))
    rows.append(("near_duplicate_share", result.near_duplicate_share, math.nan))
    mle = result.mle
    rows.append(("mle_dimension", mle.dimension, mle.dimension_std * spread))
    rows.append(("copy_share", share, math.nan))
    noise = (id_noise.standard_errors(X, settings, twonn.n_batches)
             if not share > settings.max_copy_share else {})
    return id_noise.attach(_guard(rows, share, settings.max_copy_share), noise, twonn.n_batches)


def _id_scales(X, settings) -> list[tuple]:
    """The scale profile (Facco et al. 2017; Denti et al. 2022): TwoNN by decimation of the
    whole layer and GRIDE at orders 2..max_order, each with its length scale, and the plateau
    over both (`metrics.id_plateau`).

    Rows: ``twonn_dec<j>`` (TwoNN on subsets of round(N / 2**j) states, mean over the subsets;
    std: DADApy's error of that mean, NaN for j = 0), ``twonn_dec<j>_scale`` (its mean distance
    to the first two neighbours), ``gride_k<k>_scale`` (GRIDE's mean distance of the k/2-th and
    k-th neighbours; its ID is the ``gride_k<k>`` row: the same batches and search), and
    ``id_plateau`` (std: root mean square of its points' noise), ``id_plateau_lo``,
    ``id_plateau_hi`` (its range of scales); NaN with the reason in ``note`` where there is no
    plateau or where copies exceed ``settings.max_copy_share``.
    """
    result = _id_search(X, settings, reuse=True)
    decimation = metrics.twonn_decimation(X, discard_fraction=settings.discard_fraction,
                                          seed=settings.seed)
    gride = result.gride
    spread = 1.0 if gride.n_batches > 1 else math.nan
    err = np.where(decimation.n_subsets > 1, decimation.dimension_err, math.nan)
    rows: list[tuple] = []
    for j, (dim, std, scale) in enumerate(zip(decimation.dimension, err, decimation.scale,
                                              strict=True)):
        rows += [(f"twonn_dec{j}", dim, std), (f"twonn_dec{j}_scale", scale, math.nan)]
    for order, scale in zip(gride.orders, gride.scale, strict=True):
        rows.append((f"gride_k{order}_scale", scale, math.nan))
    noise = np.concatenate([err, gride.dimension_std * spread])
    plateau = metrics.id_plateau(np.concatenate([decimation.scale, gride.scale]),
                                 np.concatenate([decimation.dimension, gride.dimension]), noise)
    if plateau.n_points:
        on = np.zeros(len(noise), dtype=bool)  # the points on the plateau, for its noise
        scales = np.concatenate([decimation.scale, gride.scale])
        on[(scales >= plateau.low) & (scales <= plateau.high)] = True
        known = noise[on & np.isfinite(noise)]
        std = float(np.sqrt(np.mean(known**2))) if known.size else math.nan
        rows += [("id_plateau", plateau.dimension, std), ("id_plateau_lo", plateau.low, math.nan),
                 ("id_plateau_hi", plateau.high, math.nan)]
    else:
        rows += [(name, math.nan, math.nan, plateau.reason)
                 for name in ("id_plateau", "id_plateau_lo", "id_plateau_hi")]
    return _guard(rows, _copy_share(result, X.shape[0]), settings.max_copy_share)
