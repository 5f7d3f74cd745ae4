"""Input checks shared by the public metric functions.

Each public metric calls these first and then a private function that only computes, so the
error a user sees names the argument and says what to do (scikit-learn's ``check_array`` style).
"""

from __future__ import annotations

import numpy as np
import torch


def as_tensor(x, name: str) -> torch.Tensor:
    """Return ``x`` as a floating torch tensor (numpy arrays and lists are converted, no copy
    where possible); raise ``ValueError`` for anything that is not numeric."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(np.asarray(x))
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"{name} must be a torch tensor or numpy array of numbers, got {type(x).__name__}"
            ) from err
    if t.dtype == torch.bool or t.is_complex():
        raise ValueError(f"{name} must hold real numbers, got dtype {t.dtype}")
    if not t.is_floating_point():
        t = t.to(torch.float32)
    return t


def check_finite(t: torch.Tensor, name: str) -> None:
    # A NaN or Inf anywhere makes the sum non-finite: one cheap reduction for the common case,
    # the element-wise check only when the sum is not finite (bad values, or a sum overflow).
    if bool(torch.isfinite(t.sum())):
        return
    if not bool(torch.isfinite(t).all()):
        n_bad = int((~torch.isfinite(t)).sum())
        raise ValueError(
            f"{name} contains {n_bad} NaN or Inf value(s); remove or fix them before computing "
            "the metric (a diverged run or an overflow in half precision are common causes)"
        )


def check_matrix(x, name: str, *, min_rows: int = 2, min_cols: int = 1) -> torch.Tensor:
    """Check an (n, d) matrix of row vectors: 2-D, enough rows and columns, finite."""
    t = as_tensor(x, name)
    if t.ndim != 2:
        raise ValueError(
            f"{name} must be 2-D of shape (n_points, n_features), got shape {tuple(t.shape)}; "
            "flatten batch and time first, e.g. X.reshape(-1, X.shape[-1])"
        )
    n, d = t.shape
    if n < min_rows:
        raise ValueError(f"{name} needs at least {min_rows} rows (points), got {n}")
    if d < min_cols:
        raise ValueError(f"{name} needs at least {min_cols} column(s) (features), got {d}")
    check_finite(t, name)
    return t


def check_paired(X, Y, *, min_rows: int = 2) -> tuple[torch.Tensor, torch.Tensor]:
    """`check_matrix` of both, and the same number of rows: row ``i`` of each from the same
    token (two layers, checkpoints or models of the same inputs)."""
    X = check_matrix(X, "X", min_rows=min_rows)
    Y = check_matrix(Y, "Y", min_rows=min_rows)
    if X.shape[0] != Y.shape[0]:
        raise ValueError(
            f"X and Y must have the same number of rows (paired inputs), got {X.shape[0]} and "
            f"{Y.shape[0]}; select the same tokens from both"
        )
    return X, Y


def check_int(value, name: str, *, minimum: int | None = 1) -> int:
    """An integer (not a bool) of at least `minimum` (any integer when `minimum` is None)."""
    need = "an integer" if minimum is None else f"an integer >= {minimum}"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be {need}, got {value!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be {need}, got {value}")
    return int(value)


def check_fraction(value, name: str, *, low: float = 0.0, high: float = 1.0,
                   include_low: bool = True, include_high: bool = False) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{name} must be a number, got {value!r}") from err
    ok_low = v >= low if include_low else v > low
    ok_high = v <= high if include_high else v < high
    if not (ok_low and ok_high and np.isfinite(v)):
        lo = "[" if include_low else "("
        hi = "]" if include_high else ")"
        raise ValueError(f"{name} must lie in {lo}{low}, {high}{hi}, got {value!r}")
    return v


def check_valid_mask(valid, name: str, batch: int, time: int, device) -> torch.Tensor | None:
    """Check an optional (B, T) boolean mask of positions to include."""
    if valid is None:
        return None
    v = valid if isinstance(valid, torch.Tensor) else torch.as_tensor(np.asarray(valid))
    if v.dtype != torch.bool:
        raise ValueError(f"{name} must be a boolean tensor, got dtype {v.dtype}")
    if tuple(v.shape) != (batch, time):
        raise ValueError(f"{name} must have shape (B, T) = ({batch}, {time}), got {tuple(v.shape)}")
    if not bool(v.any()):
        raise ValueError(f"{name} marks no position as valid; include at least one position")
    return v.to(device)
