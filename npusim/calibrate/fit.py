"""Robust least squares on log error, field selection and k-fold cross-validation.

The residual of a measured row is log(simulated / measured). The loss is soft-L1
(Huber-like) on it, so a few rows far off (a kernel msprof caught during a clock
change, an op the mapping reads wrongly) pull the fit less than squares would. The
solver is Levenberg-Marquardt with iteratively reweighted least squares: the
Jacobian is taken by finite differences once at the start and then kept current
with Broyden's rank-one updates (one simulation of the distinct ops per step).
numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from attrs import frozen

from npusim.calibrate.model import Model, OpKey

SOFT_L1_SCALE = 0.05  # residuals beyond ~5% (in log) count linearly, not squared
STEP = math.log(1.2)  # finite-difference step of the Jacobian: a 20% change of the field
# a field is fitted only if a 20% change of it, after the best compensation by the
# fields already chosen, still moves some op's time by this much: smaller effects are
# lost in run-to-run noise of real measurements (a few percent)
MIN_EFFECT = 0.005
# an integer field smaller than this moves in steps of more than 10% of itself: too
# coarse for a relative fit (a start-up of 4 cycles can only go to 3 or 5)
MIN_INTEGER = 10
# assumed: run-to-run spread of a measured kernel or collective time, one standard
# deviation in log (a few percent on a quiet card)
MEASUREMENT_NOISE = 0.03
# assumed: how far an assumed field's value may be from the truth, one standard
# deviation in log (about 25%: no source gives these values, but they are not guesses
# to a factor of two); the fit's prior (PRIOR_WEIGHT)
PRIOR_SPREAD = 0.25
# a field is fitted only if, at MEASUREMENT_NOISE, the measurements pin it to this (one
# standard error in log, every other fitted field free): the value a fit reports is one
# the measurements give, not a trade of the assumption for noise
PINNED = 0.10
MAX_STEP = 0.7  # largest change of log(value) per iteration (a factor of 2)
MAX_ITERATIONS = 25
TOLERANCE = 2e-3  # stop when no field moves by more than this (in log: 0.2%) in a step,
MIN_GAIN = 1e-3  # or the loss falls by less than this fraction of itself,
MAX_REJECTED = 4  # or this many steps in a row fail to lower it (each costs a simulation of every op);
MAX_REFRESHES = 3  # then the Jacobian is measured again at the point reached, at most this many times


@frozen
class Excluded:
    field: str
    reason: str


def jacobian(model: Model, theta: np.ndarray, keys: Sequence[OpKey], f0: np.ndarray) -> np.ndarray:
    """d log(time) / d log(value): one column per field, by forward differences (an
    integer field steps by at least 1, or rounding would hide the change)."""
    cols = []
    for j, v0 in enumerate(model.v0):
        h = STEP
        if model.integer[j] and v0 > 0:
            h = max(STEP, math.log((v0 * math.exp(theta[j]) + 1) / (v0 * math.exp(theta[j]))))
        t = theta.copy()
        t[j] += h
        if model.fields[j].endswith("_efficiency") and model.v0[j] * math.exp(t[j]) > 1:
            t[j] = theta[j] - h  # at its cap of 1: step down instead
            h = -h
        cols.append((model.log_times(t, keys) - f0) / h)
    return np.stack(cols, axis=1) if cols else np.zeros((len(keys), 0))


def _residual(J: np.ndarray, w: np.ndarray, j: int, others: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Column j of J less the weighted least-squares fit of columns `others` to it, and
    that fit's coefficients: what field j does that the others cannot mimic."""
    if not others:
        return J[:, j], np.zeros(0)
    coef, *_ = np.linalg.lstsq(w[:, None] * J[:, others], w * J[:, j], rcond=None)
    return J[:, j] - J[:, others] @ coef, coef


def _moved(rest: np.ndarray) -> np.ndarray:
    return np.abs(rest) * STEP >= MIN_EFFECT


NO_OP = -1  # _sole_identifier: not even every op together identifies the field


def _sole_identifier(J: np.ndarray, w: np.ndarray, j: int, others: list[int]) -> int | None:
    """The op without which field j is no longer identified (no other op moved by
    MIN_EFFECT once the fields `others` are fitted), NO_OP if the others mimic it on
    every op, or None if j survives leaving out any one op."""
    movers = np.flatnonzero(_moved(_residual(J, w, j, others)[0]))
    if len(movers) == 0:
        return NO_OP
    for i in movers:
        keep = np.arange(J.shape[0]) != i
        if not _moved(_residual(J[keep], w[keep], j, others)[0]).any():
            return int(i)
    return None


def select_fields(model: Model, J: np.ndarray, weights: np.ndarray,
                  labels: Sequence[str] | None = None) -> tuple[list[int], list[Excluded]]:
    """The columns of J (fields) the ops identify; the others excluded with the reason.

    A field is screened out if it cannot be fitted on a log scale (0, a coarse integer)
    or moves no op by MIN_EFFECT for a 20% change. The rest are taken strongest first,
    each kept if what the fields kept before it cannot mimic still moves some op by
    MIN_EFFECT. Then, with every kept field free: a field that one op alone identifies
    (leave that op out and no other is moved by MIN_EFFECT) is dropped, as no held-out
    op could check its value (leave-one-out identifiability); and so is one the
    measurements, at MEASUREMENT_NOISE, pin more loosely than PINNED - the
    weakest first, until all are pinned.
    `weights`: rows per op; `labels`: how the reasons name the ops."""
    w = np.sqrt(weights)
    labels = labels or [f"op {i}" for i in range(J.shape[0])]
    order = sorted(range(J.shape[1]), key=lambda j: (-np.linalg.norm(w * J[:, j]), j))
    kept: list[int] = []
    excluded = []
    for j in order:
        col = J[:, j]
        name = model.fields[j]
        if model.v0[j] == 0:
            excluded.append(Excluded(name, "its value is 0: a relative (log-scale) fit cannot move it"))
            continue
        if model.integer[j] and model.v0[j] < MIN_INTEGER:
            excluded.append(Excluded(name, f"an integer of {model.v0[j]:g}: one unit is a step of "
                                           f"{100 / model.v0[j]:.0f}%, too coarse to fit"))
            continue
        if np.max(np.abs(col)) * STEP < MIN_EFFECT:
            excluded.append(Excluded(name, f"a 20% change moves no op in the profile by {100 * MIN_EFFECT:.1f}% "
                                           f"(largest {100 * np.max(np.abs(col)) * STEP:.2f}%)"))
            continue
        rest, coef = _residual(J, w, j, kept)
        if kept and np.max(np.abs(rest)) * STEP < MIN_EFFECT:
            mimic = kept[int(np.argmax(np.abs(coef)))]
            excluded.append(Excluded(name, f"on these ops its effect is mimicked by {model.fields[mimic]} "
                                           "(not separable)"))
            continue
        kept.append(j)
    while kept:  # leave-one-out identifiability, every kept field free, the weakest first
        lone = next(((j, i) for j in reversed(kept)
                     if (i := _sole_identifier(J, w, j, [f for f in kept if f != j])) is not None), None)
        if lone is None:
            break
        j, i = lone
        if i == NO_OP:
            reason = "on these ops its effect is mimicked by the other fitted fields together (not separable)"
        else:
            reason = (f"only {labels[i]} identifies it: without that op no other moves it by "
                      f"{100 * MIN_EFFECT:.1f}% once the other fields are fitted, so no held-out op can check "
                      "its value")
        excluded.append(Excluded(model.fields[j], reason))
        kept.remove(j)
    while kept:  # precision at the assumed measurement noise
        A = w[:, None] * J[:, kept]
        se = MEASUREMENT_NOISE * np.sqrt(np.diag(np.linalg.pinv(A.T @ A)))
        pos = int(np.argmax(se))
        if se[pos] <= PINNED:
            break
        excluded.append(Excluded(model.fields[kept[pos]], f"these ops pin it only to +-{100 * se[pos]:.0f}% "
                                 f"(one standard error at {100 * MEASUREMENT_NOISE:.0f}% measurement noise), looser "
                                 f"than the +-{100 * PINNED:.0f}% a fitted value must be pinned to"))
        kept.pop(pos)
    return sorted(kept), excluded


def _weights(r: np.ndarray) -> np.ndarray:
    """IRLS weights of soft-L1: rho(r) = 2 s^2 (sqrt(1 + (r/s)^2) - 1)."""
    return 1.0 / np.sqrt(1.0 + (r / SOFT_L1_SCALE) ** 2)


def _loss(r: np.ndarray) -> float:
    return float(np.sum(2 * SOFT_L1_SCALE**2 * (np.sqrt(1.0 + (r / SOFT_L1_SCALE) ** 2) - 1)))


# the prior's weight: an assumed value is off from the truth by PRIOR_SPREAD (one standard
# deviation in log), a measurement by MEASUREMENT_NOISE; in the least-squares units of
# the loss the prior adds PRIOR_WEIGHT * theta^2 per field (the posterior's mode, not the
# likelihood's: where the rows leave a direction flat - two costs only their sum is
# seen by - the fit stays near the assumed values instead of wandering to any split)
PRIOR_WEIGHT = (MEASUREMENT_NOISE / PRIOR_SPREAD) ** 2


def _objective(r: np.ndarray, theta: np.ndarray) -> float:
    return _loss(r) + PRIOR_WEIGHT * float(theta @ theta)


def solve(model: Model, keys: Sequence[OpKey], row_key: np.ndarray, log_measured: np.ndarray,
          J0: np.ndarray | None = None, theta0: np.ndarray | None = None) -> np.ndarray:
    """theta minimising the soft-L1 loss of log(simulated / measured) over the rows
    (row_key[i]: the index in `keys` of row i's op) plus the prior (PRIOR_WEIGHT), from
    theta0 (the base config if None)."""
    theta = np.zeros(len(model.fields)) if theta0 is None else theta0.copy()
    f = model.log_times(theta, keys)
    J = jacobian(model, theta, keys, f) if J0 is None else J0.copy()
    r = f[row_key] - log_measured
    loss, damping, rejected = _objective(r, theta), 1e-3, 0
    fresh, refreshes = J0 is None, 0  # is J the finite-difference Jacobian at theta?
    for _ in range(MAX_ITERATIONS):
        w = _weights(r)
        Jr = J[row_key]
        A = Jr.T @ (w[:, None] * Jr) + PRIOR_WEIGHT * np.eye(len(theta))
        g = Jr.T @ (w * r) + PRIOR_WEIGHT * theta
        A_damped = A + damping * np.diag(np.diag(A) + 1e-12)
        step = -np.linalg.lstsq(A_damped, g, rcond=None)[0]
        step *= min(1.0, MAX_STEP / max(np.max(np.abs(step)), 1e-300))
        trial = model.snap(theta + step)
        stalled = np.array_equal(trial, theta)  # the step is below what the fields can represent
        if not stalled:
            f_trial = model.log_times(trial, keys)
            r_trial = f_trial[row_key] - log_measured
            dtheta, df = trial - theta, f_trial - f
            if dtheta @ dtheta > 0:  # Broyden: make J agree with the change just seen
                J += np.outer(df - J @ dtheta, dtheta) / (dtheta @ dtheta)
                fresh = False
            trial_loss = _objective(r_trial, trial)
            if trial_loss < loss:
                stalled = np.max(np.abs(step)) < TOLERANCE or loss - trial_loss < MIN_GAIN * loss
                rejected = 0
                theta, f, r, loss = trial, f_trial, r_trial, trial_loss
                damping = max(damping / 3, 1e-7)
            else:
                damping *= 4
                rejected += 1
                stalled = rejected >= MAX_REJECTED
        if stalled:
            # Broyden's J drifts along a direction the steps rarely take: a stall is only
            # the minimum if the Jacobian measured at theta agrees
            if fresh or refreshes >= MAX_REFRESHES:
                break
            J, fresh, refreshes, rejected, damping = jacobian(model, theta, keys, f), True, refreshes + 1, 0, 1e-3
    return theta


def folds(n_keys: int, k: int, seed: int = 0) -> list[np.ndarray]:
    """k groups of op indices (distinct ops, not rows: a held-out op is one whose shape
    the fit never saw), shuffled with a fixed seed."""
    order = np.random.default_rng(seed).permutation(n_keys)
    return [np.sort(order[i::k]) for i in range(k)]


def cross_validate(model: Model, keys: Sequence[OpKey], row_key: np.ndarray, log_measured: np.ndarray,
                   J0: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Held-out log residual of every row and the mean of the folds' fitted theta. Each
    fold runs the whole procedure without its ops: select_fields on the other folds'
    ops (a field they do not identify stays at the base value), fit, then predict
    this fold's ops - so the error is that of calibrating without them."""
    held = np.full(len(row_key), np.nan)
    thetas = []
    weights = np.bincount(row_key, minlength=len(keys)).astype(float)
    for fold in folds(len(keys), k):
        train = np.setdiff1d(np.arange(len(keys)), fold)
        remap = -np.ones(len(keys), dtype=int)
        remap[train] = np.arange(len(train))
        rows = np.isin(row_key, train)
        train_keys = [keys[i] for i in train]
        kept, _ = select_fields(model, J0[train], weights[train])
        theta = np.zeros(len(model.fields))
        if kept:
            sub = model.with_fields([model.fields[j] for j in kept])
            theta[kept] = solve(sub, train_keys, remap[row_key[rows]], log_measured[rows], J0[train][:, kept])
        thetas.append(theta)
        test_rows = np.isin(row_key, fold)
        pred = model.log_times(theta, [keys[i] for i in fold])
        where = {int(key): i for i, key in enumerate(fold)}
        held[test_rows] = pred[[where[int(i)] for i in row_key[test_rows]]] - log_measured[test_rows]
    return held, np.mean(thetas, axis=0)
