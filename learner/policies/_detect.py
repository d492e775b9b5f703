"""Change detection on each arm's reward residuals, and discounting of the arms it flags.

Forgetting every row (``gamma < 1``) follows drift but throws away evidence in a stationary
world, on every arm, all the time. A detector forgets only when an arm's rewards stop agreeing
with its model. For each row an arm learns (weight > 0), in order:

1. **Residual** ``e = r - x . theta``, ``theta = A^-1 b`` the arm's posterior mean as the batch
   finds it (one stacked solve per batch, so a batch is still learned as one rank-k update).
2. **Standardised** ``z = clip((e - m) / s, -CLIP, CLIP)`` by the arm's running residual mean
   ``m`` and scale ``s = sqrt(pi / 2) * mean |e|`` (a Gaussian's sd from its mean absolute
   value: finite under heavy tails, where a variance is not), both discounted means with a
   memory of ``MEMORY`` rows, frozen over a batch like the model. Centring on ``m`` makes this
   Page-Hinkley rather than a CUSUM against zero: the bias a linear model keeps where it is
   wrong (a 0/1 reward, a threshold) is not a change; the clip bounds what one outlier adds.
3. **Two-sided Page-Hinkley** ``g+ <- max(0, g+ + z - DELTA)``, ``g- <- max(0, g- - z - DELTA)``;
   an alarm when either exceeds ``detect_threshold``.
4. **The baseline holds** while the test is under way: a batch that leaves g+ or g- above
   ``HOLD`` (half) of the threshold does not move ``m`` and ``s``. Otherwise they take in the
   very residuals under test: while an arm has fewer than ``MEMORY`` rows they are plain
   averages over them all, and on ``drift_abrupt`` at B = 1 (seed 0) an arm's g- reached 15.8
   after the change while its ``m`` moved from -0.05 to -0.34 and ``s`` from 0.57 to 0.89: g-
   fell back and never alarmed. Holding them, that stream's regret went from 1,475 to 1,328
   over seeds 0-2 (B = 200: 1,555 to 1,550). At half the threshold a stationary stream rarely
   gets there: of the suite's 60 stationary runs (B = 200 and 1, seeds 0-2), two raised one
   more false alarm, linear at B = 200 (+0.1 %) and nonlinear at B = 1 (+2 %, where the linear
   model misfits); at a quarter, three runs at B = 200 alone did (linear, wine, heavy_tail).

An arm is watched once it has learned ``dim`` rows since it started or was last flagged (its
model has settled) and ``CALIBRATION`` more have set ``m`` and ``s``. On an alarm the arm's
statistics are discounted toward its prior before the batch is added::

    S <- S0 + keep * (S - S0)          (A and b; as forgetting does, see base)

with ``keep = detect_keep``, default 0: the arm goes back to its prior and learns on from the
batch that raised the alarm. At the default threshold an alarm is strong evidence that the old
rows describe another world, and any share of them kept is a share of rows from that world: it
weighs as ``keep`` times the arm's rows, so it grows with how long the arm was stable, and an
arm played for 5,000 rows that keeps 5 % still answers with 250 stale rows against a few dozen
new ones (on ``drift_abrupt``, ``keep = 0.05`` had 1.2-1.5x the regret of 0, 0.25 had 2-3x).
The price of keeping nothing is paid on a false alarm, which at this threshold the regret suite
never raised. The detector then starts over (its counts, ``m``, ``s`` and ``g``) and the arm's
alarm count goes up by one; the batch's rows after the alarm are learned but not tested (they
would be tested against the discarded model).

Why Page-Hinkley and these defaults: a change of the reward function moves the residuals of the
contexts an arm is shown (the policy shows each arm where it looks best, so a worse arm's
residuals turn negative, a better one's positive), and CUSUM-type statistics are the fastest
detectors of such a mean shift for a given false-alarm rate (Lorden 1971). ``DELTA = 0.5``
tunes it to shifts of one residual sd. By Siegmund's approximation, at threshold h a shift of
one sd is flagged in about ``2 h`` rows, two sds in about ``2 h / 3``, and Gaussian residuals
raise a false alarm once in about ``2 exp(h + 1.17)`` rows per side: at 10, 20 rows and one in
70,000 rows (both sides); at the default 20, 40 rows and one in 1.5e9. Real residuals are not
Gaussian (a linear model's residuals on 0/1 rewards have heavy tails against their mean
absolute value): on ``benchmarks/regret.py``, threshold 10 raised 1-5 false alarms per run on
``iris`` and ``heavy_tail`` (up to 18 % more regret), 15 two on one ``iris`` run, 20 none on any
stationary environment, B = 200 or 1, seeds 0-2, while it flagged 8-10 of the 10 arms of
``drift_abrupt`` and cut its regret 4-5x. ADWIN would also work, at the cost of a window of
buckets per arm in the state; Page-Hinkley needs five numbers. It does not catch a slow drift
(``drift_gradual``): the residuals of a model that follows a rotating truth stay small, and a
threshold low enough to flag them (6) costs stationary environments 10-60 %.

The detector's state is part of each arm's state (``detect_stats``: discounted row count, sum
of residuals, sum of their absolute values; ``detect_ph``: g+ and g-; ``detect_rows``: rows
since the arm started or was flagged; ``detect_alarms``), serialised in both views, so a
restarted learner continues bit for bit and a snapshot shows the alarm count
(:meth:`~learner.policies.base.Policy.drift`). A state written without them (before the
detector) loads with the detector fresh. Everything is a function of the batches and the
state: the same batches give the same bits.

When the C extension ``learner._fastscore`` is built, its ``detect`` runs the loop over a
batch's arms (per arm, a dozen small numpy calls cost more than the arithmetic: at d = 32 the
detector halved the update rate); :func:`_detect_arms`, in numpy, is the fallback and the
reference. Both do the same floating-point operations in the same order, so a source tree
without a compiler gives the same state, bit for bit. That order is fixed where numpy or BLAS
would choose one: ``x . theta`` is summed left to right from the first product; ``g`` of a
batch is ``W_t - min(0, min_(s<=t) W_s)`` with ``W_t = g_0 + (step_1 + ... + step_t)``
summed left to right (equal to the recursion of 3.); and with ``p_k = decay^k`` built as a
running product (``p_0 = 1``, ``p_k = p_(k-1) * decay``, ``decay = 1 - 1 / MEMORY``), an
arm's ``m`` learned residuals ``e_1 .. e_m`` update its statistics as ``n <- p_m * n +
(p_(m-1) + ... + p_0)``, ``total <- p_m * total + (p_(m-1) * e_1 + ... + p_0 * e_m)`` and
``total_abs`` alike with ``|e_i|``, each sum left to right from its first term. (Before the
compiled path, the residuals and these sums were BLAS dot products and ``p_k`` powers: a
state written then continues with these roundings, which differ from those in the last bits.)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

try:
    from learner import _fastscore
except ImportError:  # not built: the numpy path below detects
    _fastscore = None

#: Page-Hinkley allowance, in residual sds: half the smallest shift detected fast.
DELTA = 0.5
#: Standardised residuals are clipped to +-CLIP: one outlier moves g by at most CLIP - DELTA.
CLIP = 3.0
#: Memory of the running residual mean and scale, in rows of the arm.
MEMORY = 500
#: Rows that set the residual mean and scale before the statistic is tested.
CALIBRATION = 30
#: A batch that leaves g+ or g- above this share of the threshold does not move the residual
#: mean and scale: a change under test must not become the baseline it is tested against.
HOLD = 0.5
_SD_FROM_MEAN_ABS = math.sqrt(math.pi / 2.0)
#: Per-row discount of the running residual mean and scale.
_DECAY = 1.0 - 1.0 / MEMORY


class DriftDetection:
    """Parameters and mechanics of the residual change detector for per-arm linear models (see
    the module docstring); a mixin before :class:`~learner.policies._linear.LinearPolicy`.

    - ``detect``: run the detector (default true).
    - ``detect_threshold``: Page-Hinkley alarm level in residual sds (> 0, default 20).
    - ``detect_keep``: share of a flagged arm's evidence kept, in [0, 1] (default 0: back to
      the prior; 1 only counts alarms, a way to watch before letting it act).
    """

    def __init__(
        self, dim: int, *, detect: bool = True, detect_threshold: float = 20.0, detect_keep: float = 0.0, **kwargs: Any
    ) -> None:
        if not isinstance(detect, (bool, np.bool_)):
            raise ValueError(f"detect must be true or false, got {detect!r}")
        if not (detect_threshold > 0.0 and np.isfinite(detect_threshold)):
            raise ValueError(f"detect_threshold must be finite and > 0, got {detect_threshold!r}")
        if not 0.0 <= detect_keep <= 1.0:
            raise ValueError(f"detect_keep must be in [0, 1], got {detect_keep!r}")
        self.detect = bool(detect)
        self.detect_threshold = float(detect_threshold)
        self.detect_keep = float(detect_keep)
        super().__init__(dim, **kwargs)

    def _detector_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        if not self.detect:
            return {}  # the state's layout is exactly as before the detector
        f8, i8 = np.dtype(np.float64), np.dtype(np.int64)
        return {"detect_stats": ((3,), f8), "detect_ph": ((2,), f8), "detect_rows": ((), i8), "detect_alarms": ((), i8)}

    def _alarms(self, slot: int) -> int:
        return int(self._arrays["detect_alarms"][slot]) if self.detect else 0

    def _detect(
        self,
        slots: np.ndarray,
        starts: np.ndarray,
        counts: np.ndarray,
        X: np.ndarray,
        r: np.ndarray,
        w: np.ndarray,
        theta: np.ndarray | None = None,
    ) -> np.ndarray | None:
        if not self.detect:
            return None
        arrays = self._arrays
        state = tuple(arrays[n] for n in ("detect_stats", "detect_ph", "detect_rows", "detect_alarms"))
        watched = arrays["detect_rows"][slots] >= self.dim
        if theta is not None:  # every arm's, solved once for robust learning too: the same bits per arm
            theta = theta[watched]
        else:
            theta = self._means_of(slots[watched]) if watched.any() else np.zeros((0, self.dim))
        keep, threshold = np.ones(len(slots)), self.detect_threshold
        hold = HOLD * threshold
        if _fastscore is not None:
            _fastscore.detect(
                *state,
                keep,
                slots,
                starts,
                counts,
                np.ascontiguousarray(X),
                np.ascontiguousarray(r),
                np.ascontiguousarray(w),
                np.ascontiguousarray(theta),
                (self.dim, CALIBRATION, _DECAY, _SD_FROM_MEAN_ABS, DELTA, CLIP, threshold, self.detect_keep, hold),
            )
        else:
            _detect_arms(state, keep, slots, starts, counts, X, r, w, watched, theta, threshold, self.detect_keep, hold)
        return keep if (keep < 1.0).any() else None

    def _means_of(self, slots: np.ndarray) -> np.ndarray:
        """``theta = A^-1 b`` of these arms from their statistics as they stand (one stacked
        solve: a function of ``A`` and ``b`` alone, whatever was cached or decided before)."""
        return np.linalg.solve(self._arrays["A"][slots], self._arrays["b"][slots][:, :, None])[:, :, 0]


def _detect_arms(
    state: tuple[np.ndarray, ...],
    keep: np.ndarray,
    slots: np.ndarray,
    starts: np.ndarray,
    counts: np.ndarray,
    X: np.ndarray,
    r: np.ndarray,
    w: np.ndarray,
    watched: np.ndarray,
    theta: np.ndarray,
    threshold: float,
    keep_on_alarm: float,
    hold: float,
) -> None:
    """The detector over a batch in numpy (the reference; ``learner._fastscore.detect`` does the
    same operations in the same order): updates ``state`` (stats, ph, rows, alarms) in place and
    sets ``keep[j]`` of a flagged arm j."""
    stats, ph, rows, alarms = state
    theta_of_row = np.zeros(X.shape)
    for t, (lo, k) in enumerate(zip(starts[watched].tolist(), counts[watched].tolist())):
        theta_of_row[lo : lo + k] = theta[t]
    e_all = r - _row_dots(X, theta_of_row)  # every row's at once; those of unwatched arms unused
    for j, (slot, lo, k) in enumerate(zip(slots.tolist(), starts.tolist(), counts.tolist())):
        learned = w[lo : lo + k] > 0.0
        if not watched[j]:
            rows[slot] += int(np.count_nonzero(learned))
            continue
        e = e_all[lo : lo + k]
        if not learned.all():
            e = e[learned]
        if not len(e):
            continue
        n, total, total_abs = stats[slot].tolist()
        holding = False
        if n >= CALIBRATION:
            scale = max(_SD_FROM_MEAN_ABS * total_abs / n, 1e-12)
            z = np.clip((e - total / n) / scale, -CLIP, CLIP)
            up = _page_hinkley(ph[slot, 0], z - DELTA)
            down = _page_hinkley(ph[slot, 1], -z - DELTA)
            if (up > threshold).any() or (down > threshold).any():
                keep[j] = keep_on_alarm
                alarms[slot] += 1
                stats[slot] = 0.0
                ph[slot] = 0.0
                rows[slot] = 0
                continue
            ph[slot] = up[-1], down[-1]
            holding = max(up[-1], down[-1]) > hold  # half way to an alarm: the baseline holds
        if not holding:
            powers = _powers(len(e))
            weights = powers[len(e) - 1 :: -1]  # decay^(m-1), ..., decay^0: the newest row weighs 1
            old = powers[len(e)]
            stats[slot] = (
                old * n + _sequential_sum(weights),
                old * total + _sequential_sum(weights * e),
                old * total_abs + _sequential_sum(weights * np.abs(e)),
            )
        rows[slot] += len(e)


def _row_dots(X: np.ndarray, T: np.ndarray) -> np.ndarray:
    """``X[i] . T[i]`` for every row, summed left to right from the first product (a
    cumulative sum, which numpy adds in order; BLAS's order is its own and not repeatable in C)."""
    return np.cumsum(X * T, axis=1)[:, -1]


def _sequential_sum(values: np.ndarray) -> float:
    """``v_0 + v_1 + ... + v_(m-1)`` left to right (numpy's sum adds pairwise, BLAS in its own order)."""
    return float(np.cumsum(values)[-1])


#: ``decay^k`` for k = 0, 1, ...: each the one before times decay (a cumulative product), so
#: any prefix is the same whatever length was asked for; grown on demand.
_POWERS = np.concatenate(([1.0], np.cumprod(np.full(1024, _DECAY))))


def _powers(m: int) -> np.ndarray:
    """``decay^0 .. decay^m`` (at least m + 1 of the table's values)."""
    global _POWERS
    table = _POWERS
    if len(table) <= m:
        table = np.concatenate(([1.0], np.cumprod(np.full(2 * m, _DECAY))))
        _POWERS = table
    return table


def _page_hinkley(start: float, steps: np.ndarray) -> np.ndarray:
    """``g_t = max(0, g_(t-1) + steps_t)`` from ``g_0 = start >= 0``, for every t, in closed form:
    ``W_t - min(0, min_(j<=t) W_j)`` with ``W_t = start + sum_(i<=t) steps_i``."""
    W = start + np.cumsum(steps)
    return W - np.minimum(np.minimum.accumulate(W), 0.0)
