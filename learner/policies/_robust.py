"""Robust learning: rows whose residual is an outlier for their arm weigh less (Huber).

A ridge regression fitted to rewards with heavy-tailed noise follows its outliers: one reward
of 40 where the arm's rewards spread over +-2 moves its estimate as far as twenty ordinary
rows, and early on (a few dozen rows per arm) it can rank the arms wrongly for thousands of
rows. Latencies, costs and token counts are such rewards. Each per-arm linear model therefore
learns a row with weight::

    w' = w * min(1, s / |e|),    e = r - x . theta

where ``theta`` is the arm's posterior mean as the batch finds it (the change detector's, one
stacked solve per batch) and ``s`` the arm's running ``huber_q`` quantile (0.98, say) of the
absolute residuals on the row's side of the model: of those above it for a row above, of those
below for a row below. That is one step of iteratively reweighted least squares for Huber's
loss with its threshold at ``s``: past it a row pulls the model by ``s``, not by its residual.
About one row in fifty on each side is weighed down.

**A reward of two values is never weighed.** A click one row in a hundred lies 0.99 above a
model predicting 0.01: past any quantile of the residuals, and it is the signal, not noise.
Weighed, rare successes were learned as up to 3.4 times rarer than they were. So an arm whose
rewards have taken at most two values (0/1, success/failure) learns every row as it came; its
first third value makes it continuous for good. The two sides are for continuous rewards that
are skewed: with one scale for both, breast_cancer lost 5 % and digits 3 %
(``benchmarks/regret.py``, B = 200, seeds 0-2; before the two-value rule, which now leaves
those 0/1 environments as they were).

**On by default** (``huber_q`` :data:`DEFAULT_Q`, 0.98; ``huber_q = 0`` turns it off), since
2026-11-29, but in a portfolio's members on Fourier features
(:data:`~learner.policies.portfolio.FOURIER_HUBER_Q`). Measured that day on
``benchmarks/regret.py``'s streams (ours only, seeds 0-2; the peers do not depend on this code):

- heavy_tail (Student-t noise of 2 degrees of freedom): 1,694 -> 1,187 at B = 200 (0.74x
  MABWiser LinTS's 1,610, where it was 1.05x; 1,123 with the Fourier member robust too) and
  1,710 -> 1,150 at B = 1 (0.23x VW SquareCB's 5,009);
- the other environments at B = 200: -1.4 % (nonlinear) to +0.8 % (many_arms); at B = 1 -1.3 %
  (many_arms) to +6.7 % (drift_abrupt: 1,383 -> 1,475; fifty_arms +2.7 %, the rest within
  +-1 %); the 0/1 datasets as they were;
- the demo (``banditstream demo --events 4000 --round-size 500``, seeds 0-9), whose rewards are
  bounded (a 0/1 outcome, a cache bonus, a latency penalty): its mean reward online within
  -0.25 % to +0.38 % of what it was without (2026-11-29, late; the same range as before the
  Fourier member and the warm-up rule changed).

**Tried, and left out (2026-11-30): a bound that widens where the arm knows little.** A
residual is the reward's noise plus the model's own error at ``x``, whose variance under the
ridge posterior is ``sigma^2 x . A^-1 x``. Two ways to allow for it, each against this rule
(``benchmarks/regret.py``'s streams, ours only, seeds 0-2):

- studentised residuals ``e / sqrt(1 + x . A^-1 x)`` for the scale and the weights: at B = 1
  drift_abrupt 1,475 -> 1,385, heavy_tail 1,150 -> 1,037, many_arms 3,501 -> 3,040, fifty_arms
  2,125 -> 2,046, new_arms 832 -> 851, at B = 200 many_arms 3,044 -> 2,939, heavy_tail 1,187 ->
  1,205, the rest within 3 % at B = 1 and 0.5 % at B = 200; but an arm's first scale, set from
  its first block against a prior far wider than its rewards, came out too small and weighed
  many of its next blocks' rows: the demo (``--events 4000 --round-size 500``) lost 0.7-3.8 %
  of its reward online on seeds 4-7 against robust learning off (seed 7's support_templates
  0.876 -> 0.820).
  Its first scales set from raw residuals brought the demo back and lost drift_abrupt (1,490);
- the scale as here and each row's bound ``s sqrt(1 + x . A^-1 x)``: the demo within -0.04 % to
  +0.38 % of off (seeds 0-9), regret mixed within 3 % (B = 1: drift_abrupt 1,429, fifty_arms
  2,064, heavy_tail 1,174; B = 200: drift_gradual 1,274, heavy_tail 1,201, nonlinear 2,921).

Either needs ``x . A^-1 x``, a stacked inverse (or second factorisation) of the arms with rows
past their scale, every batch: ``benchmarks/learner.py`` in the same sitting (a busy one, two
runs each) had LinUCB alone at d = 128 at 19,700-20,800 rows a second against 36,100-36,500
with this rule, the default portfolio at 9,000-10,000 against 13,600-14,500 (d = 32:
42,200-52,200 against 59,000-67,400). For a demo that loses up to 3.8 % (the first) or regret
that moves within the seeds' noise (the second), that is too much of the update's margin over
its targets. A cheaper ``x . A^-1 x`` (from the detector's solve, sharing its factorisation)
would make the second worth measuring again.

Before the scales moved toward each block's own quantile and started from both sides together
(below), the demo lost up to 5.2 % with it (seed 2; 4.6 % on seed 8, 2.0 % on seed 7), and
heavy_tail came to 1,043 at B = 200. First scales set per side, with today's moves, gave
heavy_tail 1,042 (not run on the demo); set only from an arm's WARM-th row on, 1,274.

The default is left out of a policy's parameters (:meth:`RobustLearning.get_params`) and the
scales out of its scoring view, so a snapshot of a default domain reads as before robust
learning and an SDK from before it decides with it. A domain that learned without it takes its
arms' state as it is; their scales start at their next batch.

What it costs: the detector's stacked solve for every arm of a batch (once, for both) and a
dozen vectorised passes over the rows. ``update_batch`` of ``lin_igw`` alone, 20 arms, batches
of 1,000 rows (2026-11-29, one run on a busy machine): 2.06 million rows a second without it and
0.95 million with it at d = 32; 244,000 and 210,000 at d = 128. With the block-wise scales: 2.16
and 0.95 million at d = 32 (one run); 234,000-235,000 and 174,000-202,000 at d = 128 (two).

Each side's quantile is tracked per arm on the log scale, over the batch's learned rows
(weight > 0) on that side, with ``s`` frozen over the batch like ``theta``. A side with fewer
than ``1 / (1 - q)`` rows in the batch (50 at 0.98) takes a step of stochastic approximation::

    log s <- log s + clip(ETA * (k - m (1 - q)), -MAX_STEP, MAX_STEP)

for ``m`` rows of which ``k`` had ``|e| > s``: at the quantile, ``k`` is ``m (1 - q)`` on average
and ``s`` stays. A side with more has a quantile of its own, ``s_b``, and moves toward it as a
running quantile that forgets over :data:`MEMORY` such widths of rows::

    log s <- log s + m / (m + MEMORY / (1 - q)) * (log s_b - log s)

The learner folds blocks of up to 1,024 rows (:mod:`streams._learn_shard`), so the steps alone,
at most ``MAX_STEP`` a block, could not move a scale far: in the demo, before the moves toward a
block's own quantile, an arm's "below" scale, set from the few rows of its first block under the
model, stayed at 0.08-0.2 (above: 1.3-1.4), and 20-60 % of its rows were weighed, some to 0.08
of their weight. Rows are weighed from the arm's :data:`WARM`-th on. Until then a new arm's
scales, both sides together, are the greatest of its batches' quantiles of their learned rows:
the first block is learned against the prior's mean, where one side may hold a handful of rows,
and at one update per event each batch is one row, whose residual alone set an arm's first
scale before (2026-11-29). One small residual then weighed most of the arm's next rows down,
while a scale set too high only leaves rows unweighed: at B = 1 (seeds 0-2; without robust
learning, with the first residual, with the greatest) many_arms, a hundred arms of a few rows
each, had 3,546, 4,128, 3,501; new_arms 839, 877, 832; heavy_tail 1,710, 1,021, 1,150 (an
outlier among an arm's first rows keeps its scale high a while); fifty_arms 2,070, 2,059, 2,125.
An arm restarted by its detector (it has learned rows before) takes the first batch's quantile
instead: with the greatest, drift_abrupt had 1,567 at B = 1 against 1,407 (1,383 without), with
this 1,475. At B = 200 only the streams of 50 and 100 arms moved (-0.2 % to -1.0 %). An arm
the change detector flags starts its scales over (its residuals were of the discarded model);
so does an arm a portfolio member takes an alarm for (``alarms_from``), and one loaded from a
state written without them.

The scales are per-arm state (``robust_scale``: below, above; ``robust_rows``; ``robust_range``
and ``robust_kind`` for the two-value rule), serialised in the full view like the detector's, so
a restarted learner continues bit for bit. A scoring view (a snapshot) leaves them out: deciding
never reads them, and an SDK from before robust learning refuses a blob with arrays it does not
know. They make learning depend on how rows are cut into
batches, as the detector does: the learner folds blocks aligned to offsets
(:mod:`streams._learn_shard`), which cut the same way after any restart (a shard rebuilt from
the posterior topic after a takeover cuts where the previous owner published: every row counted
once, the weights not bit for bit). A batch equals its rows learned one by one only with
``huber_q = 0``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from learner.policies._detect import _row_dots

#: The quantile robust learning weighs past unless a policy sets ``huber_q`` (0 turns it off).
DEFAULT_Q = 0.98
#: Rows an arm learns unweighted while its scale settles.
WARM = 10
#: Step of the quantile's stochastic approximation, on the log scale, per row.
ETA = 0.1
#: The most the log scale moves in one batch of fewer rows than ``1 / (1 - huber_q)``.
MAX_STEP = 1.0
#: A side's batch of ``m >= 1 / (1 - huber_q)`` rows (50 at 0.98: enough to have a quantile of
#: its own) moves the log scale ``m / (m + MEMORY / (1 - huber_q))`` of the way to it.
MEMORY = 10


class RobustLearning:
    """Huber weights for per-arm linear models (see the module docstring); a mixin before the
    change detector.

    - ``huber_q``: the quantile of an arm's absolute residuals (on the row's side of its
      model) past which a row weighs less, in (0.5, 1), default :data:`DEFAULT_Q` (0.98, the
      setting measured: module docstring); 0 learns every row at its weight.
    """

    def __init__(self, dim: int, *, huber_q: float = DEFAULT_Q, **kwargs: Any) -> None:
        if isinstance(huber_q, bool) or not (huber_q == 0 or 0.5 < huber_q < 1):
            raise ValueError(f"huber_q must be 0 (off) or in (0.5, 1), got {huber_q!r}")
        self.huber_q = float(huber_q)
        super().__init__(dim, **kwargs)

    def get_params(self) -> dict[str, Any]:
        params = super().get_params()  # type: ignore[misc]
        if self.huber_q == DEFAULT_Q:  # the default is left out, so an SDK from before it loads the snapshot
            del params["huber_q"]
        return params

    def _robust_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        if not self.huber_q:
            return {}
        f8, i8 = np.dtype(np.float64), np.dtype(np.int64)
        return {"robust_scale": ((2,), f8), "robust_rows": ((), i8), "robust_range": ((2,), f8), "robust_kind": ((), i8)}

    def _batch_means(self, slots: np.ndarray) -> np.ndarray | None:
        return self._means_of(slots) if self.huber_q else None  # type: ignore[attr-defined]

    def _restart_scales(self, slots: np.ndarray) -> None:
        """These arms went back to their prior: their residuals' scales start over (what
        their rewards look like, the two-value rule's record, stays)."""
        if self.huber_q:
            self._arrays["robust_scale"][slots] = 0.0  # type: ignore[attr-defined]
            self._arrays["robust_rows"][slots] = 0  # type: ignore[attr-defined]

    def _robust(
        self,
        slots: np.ndarray,
        starts: np.ndarray,
        counts: np.ndarray,
        X: np.ndarray,
        r: np.ndarray,
        w: np.ndarray,
        keep: np.ndarray | None,
        theta: np.ndarray | None,
    ) -> np.ndarray:
        if not self.huber_q or theta is None:
            return w
        scale_of, rows_of = self._arrays["robust_scale"], self._arrays["robust_rows"]  # type: ignore[attr-defined]
        signed = r - _row_dots(X, np.repeat(theta, counts, axis=0))
        e = np.abs(signed)
        side = (signed > 0.0).astype(np.intp)  # 1: above the model, 0: below (or on) it
        scales = scale_of[slots]  # (arms, 2): below, above
        scale = np.repeat(scales, counts, axis=0)[np.arange(len(e)), side]
        flagged = np.zeros(len(slots), dtype=bool) if keep is None else keep < 1.0
        learned = w > 0
        learned_rows = np.add.reduceat(learned.astype(np.int64), starts)  # per arm
        continuous = self._continuous(slots, starts, counts, r, learned, learned_rows)
        ready = np.repeat((rows_of[slots] >= WARM) & continuous & ~flagged, counts)
        weighed = ready & learned & (scale > 0.0) & (e > scale)  # a side's scale of 0 is not set yet
        out = w * np.where(weighed, scale / np.where(weighed, e, 1.0), 1.0) if weighed.any() else w
        # each side's scale: a step toward its quantile, or, from a batch with enough rows on
        # that side to have one, a move toward the batch's own. A new arm warming up (fewer than
        # WARM rows before this batch, none of them weighed) holds the greatest of its batches'
        # quantiles, both sides together; an arm restarted since takes its first batch's.
        enough = int(np.ceil(1.0 / (1.0 - self.huber_q) - 1e-9))
        pooled: dict[int, float] = {}

        def pooled_of(i: int) -> float:
            if i not in pooled:
                lo, hi = starts[i], starts[i] + counts[i]
                pooled[i] = float(np.quantile(e[lo:hi][learned[lo:hi]], self.huber_q))
            return pooled[i]

        # (an arm's update count is never below its rows since a restart, so this is a new arm's)
        warm = (self._arrays["count"][slots] < WARM) & (learned_rows > 0)  # type: ignore[attr-defined]
        for j in (0, 1):
            on = learned & (side == j)
            m = np.add.reduceat(on.astype(np.int64), starts)
            k = np.add.reduceat((on & (e > scale)).astype(np.int64), starts)
            new = scales[:, j] * np.exp(np.clip(ETA * (k - m * (1.0 - self.huber_q)), -MAX_STEP, MAX_STEP))
            for i in np.flatnonzero(warm).tolist():
                new[i] = max(scales[i, j], pooled_of(i))
            first = (scales[:, j] == 0.0) & (m > 0) & ~warm
            for i in np.flatnonzero(first | ((scales[:, j] > 0.0) & (m >= enough) & ~warm)).tolist():
                lo, hi = starts[i], starts[i] + counts[i]
                if first[i]:
                    new[i] = pooled_of(i)
                    continue
                quantile = float(np.quantile(e[lo:hi][on[lo:hi]], self.huber_q))
                if quantile > 0.0:
                    share = m[i] / (m[i] + MEMORY * enough)
                    new[i] = float(np.exp((1.0 - share) * np.log(scales[i, j]) + share * np.log(quantile)))
            scales[:, j] = new
        scale_of[slots] = scales
        rows_of[slots] += learned_rows
        self._restart_scales(slots[flagged])
        return out

    def _continuous(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, r: np.ndarray, learned: np.ndarray, learned_rows: np.ndarray
    ) -> np.ndarray:
        """Per arm, whether its rewards so far, this batch's learned rows included (``learned``,
        ``learned_rows`` of each arm), took more than two values. The state keeps the least and
        the greatest, and the kind: 0 none yet, 1 every reward one of those two, 2 another came."""
        span, kind_of = self._arrays["robust_range"], self._arrays["robust_kind"]  # type: ignore[attr-defined]
        kind = kind_of[slots]
        settling = (kind < 2) & (learned_rows > 0)
        if settling.any():
            bmin = np.minimum.reduceat(np.where(learned, r, np.inf), starts)
            bmax = np.maximum.reduceat(np.where(learned, r, -np.inf), starts)
            inside = learned & (r > np.repeat(bmin, counts)) & (r < np.repeat(bmax, counts))
            seen = kind == 1
            lo = np.where(seen, np.minimum(span[slots, 0], bmin), bmin)
            hi = np.where(seen, np.maximum(span[slots, 1], bmax), bmax)
            # two values so far: none of the batch's strictly inside its own extremes, and every
            # extreme (the batch's, and the ones before) one of the new least and greatest
            ends = [bmin, bmax, np.where(seen, span[slots, 0], lo), np.where(seen, span[slots, 1], hi)]
            two = np.add.reduceat(inside.astype(np.int64), starts) == 0
            for value in ends:
                two &= (value == lo) | (value == hi)
            now = slots[settling]
            span[now, 0], span[now, 1] = lo[settling], hi[settling]
            kind_of[now] = np.where(two, 1, 2)[settling]
            kind = kind_of[slots]
        return kind == 2
