"""A portfolio: several policies learn side by side, and the one the domain's own log rates best acts.

Forgetting or not, how fast, a linear model or a kernel one: the right answer depends on the
traffic, and a user cannot tune on live traffic safely. A portfolio names the settings to try::

    policy: portfolio
    params:
      eps0: 0.02                      # a common setting: every member's, unless it sets its own
      members:
        - {policy: lin_igw}            # the first member acts until the log shows a better one
        - {policy: lin_igw, gamma: 0.999, label: igw-forgetting}
        - {policy: lin_igw, alpha: 0, fourier: 128, label: kernel}

Which LinUCB ``alpha`` or IGW scale (settings of how to explore, not of what is learned) the log
rates only with ``rate: policy``, and then in favour of the member that explores least ("What
the log rates", below).

**The default.** A domain that names no policy is ``policy: portfolio`` with its default members
(:data:`DEFAULT_MEMBERS`): ``lin_igw`` as it comes, the same forgetting, and SquareCB on 128
random Fourier features. On stationary linear traffic the first keeps acting, so it decides as
``lin_igw`` would; when the world drifts, the log shows the forgetting one doing better and it
takes over; where rewards are not linear in the context (thresholds, products, class regions),
the Fourier one does. Forgetting alone costs stationary traffic up to 2.3x the regret (wine),
the Fourier member alone 2x on linear traffic; the portfolio costs stationary linear traffic
nothing measurable (``docs/policies.md``), for about four times the update work of one member.
A domain that ran ``lin_igw`` when that was the default keeps what it learned: the learner and
the publisher take its state in (:meth:`Portfolio.adopt_arm_state`); one that ran the default
pair takes its states into those two members (:meth:`Portfolio.load_arm_state`).

**Learning.** Every member learns every row (:meth:`Portfolio.update_batch` passes the batch to
each), so each member's state is what it would be had it run alone on the same log. Members that
learn alike (per-arm linear policies whose settings differ only in how they decide: ``alpha``,
``v``, ``n_draws``, the IGW scale, ``eps0``) learn once:
the later one takes the first one's new statistics, count and detector state, the very bits it
would have computed itself, and the state blobs carry them once. One arm's
state is its members' states in one blob (arrays prefixed ``m<i>.``), so the learner, the store,
the posterior topic and the publisher carry a portfolio like any per-arm policy.

**Choosing who acts: progressive off-policy estimates.** For each logged row i (context,
candidates, the action taken ``a_i``, its logged propensity ``p_i``, its reward ``r_i``) every
member's model's expected reward of each candidate ``rhat_m(x_i, .)``, and the policy it is rated
as, ``pi_m(. | x_i)``, are computed by the member *before it has learned that row*
(:meth:`Portfolio.score`: in the publisher, by the previous snapshot's members on the rows logged
since it; in a simulation, by the models before the batch). One member's predictions serve as the
reward model ``rhat`` of every member's estimate, so the members' values pair: the one with the
least error on the logged rewards, recent rows weighing most (:meth:`reward_model`; squared, and
linear past twice the acting member's typical error, so a few outliers do not choose it; rewards
of two values, squared throughout). With
importance weight ``w_mi = pi_m(a_i|x_i) / p_i``, each member's doubly robust value of the row
(:meth:`Portfolio.observe`) is::

    v_mi = sum_a pi_m(a|x_i) rhat(x_i, a) + w_mi (r_i - rhat(x_i, a_i))    (w_mi <= SWITCH_WEIGHT)
    v_mi = sum_a pi_m(a|x_i) rhat(x_i, a)                                   (past it)

and ``d_ci = v_ci - v_ai`` estimates ``V(c) - V(a)``, the difference of challenger c's and the
acting member a's expected rewards, on the same rows with the same propensities. Where the weight
is moderate the estimate is unbiased whatever ``rhat`` is (the correction takes its error out),
and the better ``rhat`` predicts, the smaller its variance: far smaller than inverse propensity
scoring's, which left a member that learns a nonlinear reward (a Fourier member) unproven after
20,000 rows. Past :data:`SWITCH_WEIGHT` (switch-DR) the row counts by the model alone, biased as
the model is, rather than letting one row weighted by 1,000 set the interval for the rest of the
run. The standard error comes from the same sums. :meth:`Portfolio.select` switches to the
challenger with the highest lower bound at ``level`` (one-sided) when that bound is above zero,
once ``min_rows`` rows are in (and ``min_rows_per_arm`` per arm: over its first rows a member that
explores less, or whose model has more room, earns more than one that will do better for the rest
of the run); otherwise the acting member stays. Every member's self-normalised value ``sum w r /
sum w`` and effective sample size ``(sum w)^2 / sum w^2`` are reported
(:meth:`Portfolio.estimates`) for operators. A switch is recorded in the state (the last
:data:`MAX_SWITCHES`, with the rows seen, the estimated gain and its bound), which a snapshot
carries, so the SDK acts with the new member from the next snapshot on.

The evidence restarts at a switch: the new acting member is judged against the others from there
on, with ``min_rows`` rows again before the next switch, so a member that earned more early (and
took over) gives the acting role back once the others do better since. Between switches the sums
are cumulative: a member that is better only after a drift overtakes one that was better before
once its advantage since outweighs its deficit, which a detector or forgetting in the members
shortens (they learn the new world; the log rates them on it).

**What the log rates: what each member has learned** (``rate``, default ``greedy``). The policy
a member is rated as is its greedy choice: 1 on the candidate its model rates highest (the first
of ties), 0 elsewhere. Exploring costs on the row and pays later, in statistics that the log
cannot credit to the member that explored: it learned from the acting member's rows, as every
member did. Rated by its decide step's distribution (``rate = "policy"``), a member that
explores less tends to be rated better, and takes the acting role when it also learns
otherwise: with many candidates, where exploring pays most, the default's ``lin_igw`` handed
over to the Fourier member or forgetting, which explored least
(``benchmarks/regret.py``, :data:`DEFAULT_RATE`). Rated greedily, the log compares models (the
linear, the forgetting, the Fourier one), and how to explore stays the acting member's setting.
So members that learn alike (the same policy and learning settings, differing in ``alpha``,
``v``, the IGW scale or the floor) tie on every row, and only the earlier of them can act: a
portfolio logs a warning, once per process, naming each later one. To explore more, set it on
the members that act (``lin_igw``'s ``alpha`` grows with the number of candidates by itself).
With ``rate = "policy"`` such a member is rated, but by what its decisions earn now: one that
only explores more than the first is warned of instead. The state names the rating its evidence
was summed by (``rated``); loaded or adopted by a portfolio that rates otherwise, or written
before states named it, the evidence restarts (who acts, the switches and the reward model's
record carry).

**Fourier members.** A member may learn on random Fourier features of the row instead of the
row: ``{policy: lin_igw, fourier: 128, fourier_scale: 1.0}`` (:mod:`learner.policies._fourier`),
a kernel regression of rewards that are not linear in the context. The portfolio maps the rows
it gives that member (learning, deciding, scoring) and every process rebuilds the same map from
the parameters, so its states, snapshots and decisions are as exact as any member's. The default
holds one.

**Change detection.** A per-arm linear member runs its change detector on its own residuals
(:mod:`learner.policies._detect`) unless it names ``detect: false``. A member may instead take
an earlier member's alarms, ``alarms_from: <its label>``: whenever that member's detector flags
an arm, this member's statistics of the arm go back to its prior too, before it learns the batch
that raised the alarm (as its own detector would with ``detect_keep`` 0), if its own residuals on
that batch's rows of the arm confirm the change (``CONFIRM_T``; an arm with fewer than
``CONFIRM_ROWS`` rows in the batch is taken on trust). The default's Fourier member does:
residuals at 129 entries cost a stacked solve a batch, ``lin_igw``'s at the row's width a
fraction of that, and a change of the world moves both; the confirmation costs one solve per
alarm, and keeps an alarm of ``lin_igw``'s that comes of its model misfitting the world from
restarting the member that fits it.

**Deciding.** :meth:`Portfolio.probabilities` is the acting member's, floor included: the
logged propensity is the probability the acting member drew the action with, exact as its own.
With ``mix`` > 0 it is a mixture: ``(1 - mix)`` the acting member's distribution and ``mix`` the
mean of the other members' (each floor included), and the action is drawn from the mixture,
whose probability is what is logged: exact as the members' are. A member the acting one never
agrees with stays evaluable (its importance weights are at most ``(M - 1) / mix``), so the log
can still show it has become better; without it, an acting member that decides almost
deterministically leaves the others an effective sample size of a few rows. With ``mix_rule =
"evidence"`` each other member's share ``mix / (M - 1)`` is scaled by ``min(1, 2 P(gain > 0))``
from the estimate (:meth:`Portfolio.mix_shares`: computed from the selection sums a snapshot
carries, so the SDK mixes alike): a member the log rates clearly worse costs almost nothing.
Deciding then costs one distribution per member. Neither is on by default: the suite shows no
share that wins everywhere (``docs/policies.md``).

    >>> import numpy as np
    >>> from learner.policies import make_policy
    >>> portfolio = make_policy("portfolio", dim=2, seed=3, members=[{"policy": "lin_ucb", "alpha": 0.1},
    ...                                                            {"policy": "lin_igw", "label": "igw"}])
    >>> portfolio.labels, portfolio.acting_label
    (['lin_ucb(alpha=0.1)', 'igw'], 'lin_ucb(alpha=0.1)')
    >>> _ = portfolio.update_batch(np.ones((2, 2)), ["a", "b"], [1.0, 0.0])    # every member learns
    >>> [m.update_count("a") for m in portfolio.members]
    [1, 1]
    >>> choice = portfolio.probabilities(np.ones((2, 2)), ["a", "b"])           # the acting member's
    >>> round(float(choice.probabilities.sum()), 12)
    1.0
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from statistics import NormalDist
from typing import Any

import numpy as np

from learner.policies._detect import _row_dots, _sequential_sum
from learner.policies._fourier import FourierFeatures
from learner.policies.base import Choice, Drift, Policy, Prior, _decode, _encode, _encode_arms, _param_names, canonical_arm, draw_index, valid_dim
from learner.policies.errors import ScoringOnlyError, StateFormatError

__all__ = ["DEFAULT_LEVEL", "DEFAULT_MEMBERS", "MAX_SWITCHES", "Portfolio", "describe_state"]

log = logging.getLogger(__name__)

#: Switches kept in the state (the newest).
MAX_SWITCHES = 20
#: ``min_rows_per_arm``'s default (a state written without it reads as this)
MIN_ROWS_PER_ARM = 20

#: The members of ``policy: portfolio`` without ``members`` (and so of a domain that names no
#: policy): ``lin_igw`` with its defaults, which acts until the log says otherwise; the same
#: forgetting (``gamma`` 0.995, a half-life of about 140 of the arm's rows), which takes over on a
#: drift; and SquareCB (``lin_igw``, ``alpha`` 0) on 128 random Fourier features of the row
#: (:mod:`learner.policies._fourier`), which takes over where rewards are not linear in the
#: context. On stationary linear traffic the first keeps acting and the portfolio decides exactly
#: as ``lin_igw`` alone. Chosen by ``benchmarks/regret.py`` (``docs/policies.md``): ``gamma``
#: 0.998 did not catch the slow drift; 64 features lost to the plain row on digits and 80 on
#: digits and breast_cancer (12-17 %); 256 cost four times the learning of 128 for 0-20 % less
#: regret. The Fourier member runs no change detector of its own: it takes ``lin_igw``'s alarms
#: (``alarms_from``), so an arm whose rewards changed starts over in both. Its own detector's
#: stacked solve at 129 entries was a fifth of the default's learning; without any, a nonlinear
#: world that flips mid-stream cost 2.5 times the regret (the Fourier member kept acting on the
#: old world's statistics); with ``lin_igw``'s alarms, as with its own detector.
DEFAULT_MEMBERS = (
    {"policy": "lin_igw"},
    {"policy": "lin_igw", "gamma": 0.995},
    {"policy": "lin_igw", "alpha": 0, "fourier": 128, "detect": False, "alarms_from": "lin_igw"},
)
#: Labels default members had before, and what they are now: an arm state that names the old one
#: loads into the new (:meth:`Portfolio.load_arm_state`). The Fourier member traded its change
#: detector for ``lin_igw``'s alarms on 2026-11-28 (its detector's arrays in such a state are
#: left out).
_RENAMED = {"lin_igw(alpha=0,fourier=128)": 'lin_igw(alarms_from="lin_igw",alpha=0,detect=False,fourier=128)'}
#: ``level``'s default. The selection looks again at every batch, and at 95 % a bound crossed
#: zero by chance on stationary traffic often enough to cost it: 8-11 % more regret than
#: ``lin_igw`` alone on breast_cancer, heavy_tail and many_arms at B = 200. At 0.9999 the datasets
#: cost nothing and linear 4-7 % (one seed of three switches), and the slow drift is still caught.
DEFAULT_LEVEL = 0.9999
#: What the log rates each member as (``rate``): ``greedy``, the choice its model rates highest,
#: so the portfolio compares what the members have learned and the acting one's settings decide
#: how to explore; or ``policy``, its decide step's distribution, exploring included, which
#: tends to rate a member that explores less better (module docstring, "What the log rates").
#: Rating by the distribution, a default ``lin_igw`` made more optimistic with
#: many candidates handed the acting role to the Fourier member or forgetting, the members that
#: explored least (``benchmarks/regret.py``'s many_arms at B = 200, regret 3,379; greedy,
#: 3,084; seeds 0-5).
RATES = ("greedy", "policy")
DEFAULT_RATE = "greedy"
#: ``min_rows``' default. Over its first rows a member that explores less, or whose model has more
#: room, earns more than one that will do better for the rest of the run, and the log rates what
#: was earned: rated by the distribution (``rate = "policy"``), with 200 the Fourier member took
#: over stationary linear traffic at row 600 and cost it 16-55 % (tests/test_portfolio.py's
#: rotating world, seed 0), and heavy_tail 5-11 %. Rated greedily (the default since 2026-11-29)
#: that world keeps ``lin_igw`` at 200 and 500 too, and 500 lets the Fourier member take over
#: nonlinear rewards sooner (``benchmarks/regret.py``, seeds 0-2: nonlinear 2,935 -> 2,546 at
#: B = 200 and 2,812 -> 2,319 at B = 1; iris 810 -> 755 and 653 -> 622). But heavy-tailed rewards
#: still lift an early estimate past the bound: heavy_tail switched to the Fourier member at row
#: 600-800 on two seeds of six (seeds 0-2 +4 % at B = 200; seeds 3-5 +11 %, 1.09x to 1.21x the
#: best peer), and on seeds 3-5 nonlinear at B = 1 went from 0.25x to 0.29x. So a switch waits
#: for 2,000 rows, at the cost of up to 36 % more regret than the Fourier member alone where it
#: is the best (the wait), and none on linear traffic.
DEFAULT_MIN_ROWS = 2000
#: A member that takes another's alarms (``alarms_from``) restarts a flagged arm only if its own
#: residuals on the batch's rows of that arm (``r - x . theta``, its statistics as the batch found
#: them) have a mean more than ``CONFIRM_T`` standard errors from zero. The source's model may
#: misfit the world: ``lin_igw``'s residuals shift whenever the acting member changes which
#: contexts an arm is shown, and on ``benchmarks/regret.py``'s nonlinear world that raised an
#: alarm in two of three runs at B = 200, which restarted an arm of the Fourier member, acting
#: and right: its residuals there had t = +2.7 and -0.1. Every alarm of a real change (the
#: drift_abrupt runs, the XOR world that flips) had |t| 4.0-16.6 with 11 rows or more. It is a
#: filter, not a proof: heavy_tail's one alarm (a stationary world whose outliers move a mean)
#: had t = -7.0 in the Fourier member, which does not act there, and still restarts its arm.
CONFIRM_T = 3.0
#: ... taken on trust below this many rows of the arm in the batch (at one update per event
#: there is one): the mean of a few rows says little either way.
CONFIRM_ROWS = 8
#: Deciding settings by the direction in which they explore more: ``alpha`` (LinUCB's and IGW's
#: optimism), ``v`` (Thompson sampling's spread), ``eps0`` and IGW's new arms' ``new_arm_rows``
#: and ``new_arm_share`` up; IGW's ``gamma_scale`` and ``gamma_exponent`` down.
_EXPLORING = (("alpha", 1), ("v", 1), ("eps0", 1), ("new_arm_rows", 1), ("new_arm_share", 1), ("gamma_scale", -1),
              ("gamma_exponent", -1))
#: (first, later) member labels already warned of in this process (:meth:`Portfolio._warn_of_order`).
_WARNED_ORDER: set[tuple[str, str]] = set()
#: Settings a portfolio may give every member (a member's own value wins).
COMMON = ("eps0", "gamma", "half_life_s", "prior_mean", "prior_strength", "arm_priors", "huber_q")
#: ... of which these go only to the members whose policy has them (robust learning is the
#: per-arm linear policies').
_WHERE_IT_APPLIES = frozenset({"huber_q"})
#: A member on Fourier features learns every row at its weight (``huber_q`` 0) unless its spec,
#: or the portfolio's common settings, name ``huber_q``. Robust learning weighs a row by the
#: model as the batch finds it, which for such a member is a stacked solve at 129 entries per
#: arm per batch: it halved the default's learning (policy alone, 20 arms, 1,000-row batches,
#: d = 32: 300,000 rows a second without robust learning, 135,000 with it in all three members,
#: 255,000 with it in the two ``lin_igw`` members only; 2026-11-29, one core, beside another
#: job). What it costs in regret (``benchmarks/regret.py``'s streams, B = 200, seeds 0-2, with
#: it in the Fourier member against without): nonlinear, where that member acts, 2,892 against
#: 2,893; heavy_tail 1,123 against 1,187, all of it seed 0, which hands over to the Fourier
#: member at row 2,000-2,200 and back 2,000 rows later either way (1,274 against 1,466); the
#: other continuous streams decided alike to the digit, the 0/1 ones are never weighed.
FOURIER_HUBER_Q = 0.0
#: Parameters that shape only how a per-arm linear member decides, never what it learns.
_DECIDING = frozenset({"alpha", "v", "n_draws", "gamma_scale", "gamma_exponent", "eps0", "new_arm_rows", "new_arm_share",
                       "seed"})
#: Member keys the portfolio reads itself: the member learns on random Fourier features of the row.
_FEATURES = ("fourier", "fourier_scale")
#: ... and ``alarms_from``: the label of an earlier member whose change detector's alarms send
#: this member's flagged arms back to their prior too (see "Change detection" in the module
#: docstring).
_READ_BY_PORTFOLIO = (*_FEATURES, "alarms_from")
_SELECTION = ("select_n", "select_reward", "select_d", "select_c", "select_s", "select_w", "select_w2", "select_e", "select_rows",
              "select_range", "select_kind")
#: Per logged row, what a member's past errors keep of their weight when the portfolio picks its
#: reward model (:meth:`Portfolio.reward_model`): a half-life of 1,000 rows, so after a drift the
#: member that predicts the new rewards best serves.
ERROR_DECAY = 0.5 ** (1 / 1000)
#: A member's error on a logged reward counts squared up to this many times the acting member's
#: root mean (decayed) error so far, and linearly past it (Huber's loss): a few outliers do not
#: choose the reward model. On heavy-tailed rewards squared errors did: ``benchmarks/regret.py``'s
#: heavy_tail, B = 200, seed 0, had the Fourier member as reward model from row 500 to 1,500 by
#: a handful of residuals of 20-25 (the rewards' spread is about 1.3), and since the acting
#: member rarely plays what another member would (its picks get probabilities under
#: ``1 / SWITCH_WEIGHT``), such rows count by the reward model alone: the Fourier member's own
#: predictions rated its greedy choices 0.1 a row better than ``lin_igw``'s (the estimate at row
#: 2,000) where they were 0.3-0.4 worse, and it acted from row 2,000 to 4,000 (regret 1,466
#: against 1,045 with this bound). At 2, seeds 0-2 of the other environments moved within 1 %
#: (drift_abrupt seed 0 1,578 -> 1,582 at B = 200; drift_gradual 1,042 -> 1,033 at one update
#: per event; the rest to the digit), and the seven run on seeds 3-5 at B = 200 not at all; at 3
#: seed 0 still switched. (Seed 3 switches either way: the acting member's own optimism makes
#: its predictions of the rewards it chose the worst, so the Fourier member serves, without
#: outliers.)
#: **Rewards of two values are never bounded**, as robust learning never weighs them (its module
#: docstring): a misclassified 0/1 reward is off by about 1 where a good model's errors are a
#: third of that, and it is the signal. Bounded, the reward model changed hands on the datasets at
#: one update per event and cost iris 22 % (653 -> 797), wine 19 % (198 -> 236), breast_cancer
#: 5 % (447 -> 470). The selection keeps the least and greatest reward logged and whether
#: another came (``select_range``, ``select_kind``: 0 none yet, 1 at most those two, 2 another).
ERROR_BOUND = 2.0
#: Importance weight past which a row's correction is left out of a member's doubly robust value,
#: which is then its model's prediction alone (switch-DR, Wang, Agarwal & Dudik 2017). A member
#: that takes an action the acting one gave 1e-3 would otherwise carry that row at weight 1,000,
#: and one such row widens the interval for the rest of the run: without a switch the slow drift
#: was caught on two seeds of three (``benchmarks/regret.py``, drift_gradual, B = 200), with 100
#: on all three, and with 20 sooner (1,343 -> 1,263; breast_cancer 545 -> 515).
SWITCH_WEIGHT = 20.0
#: The selection sums that restart at a switch (the reward model's errors and the row count go on).
_EVIDENCE = ("select_n", "select_reward", "select_d", "select_c", "select_s", "select_w", "select_w2")
#: Selection sums a state written before 2026-11-28 lacks (they start at zero; the reward range
#: and kind, before 2026-11-30, at none seen).
_SELECTION_SINCE = ("select_e", "select_rows", "select_range", "select_kind")


def _restart_evidence(sums: dict[str, np.ndarray]) -> None:
    """Zero the sums that judge the members against the acting one (:data:`_EVIDENCE`)."""
    for name in _EVIDENCE:
        sums[name] = np.zeros_like(sums[name])


def _member_spec(index: int, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, Mapping):
        raise ValueError(f"members[{index}] must be a mapping like {{policy: lin_ucb, alpha: 0.3}}, got {spec!r}")
    spec = dict(spec)
    name = spec.get("policy")
    for key in ("dim", "seed", "members"):
        if key in spec:
            raise ValueError(f"members[{index}].{key}: set by the portfolio, not by a member")
    if not isinstance(name, str):
        raise ValueError(f"members[{index}].policy: a policy name is required")
    if "label" in spec and not (isinstance(spec["label"], str) and spec["label"]):
        raise ValueError(f"members[{index}].label must be a non-empty string")
    if "fourier_scale" in spec and "fourier" not in spec:
        raise ValueError(f"members[{index}].fourier_scale: needs fourier (the number of features)")
    return spec


def _label(spec: Mapping[str, Any]) -> str:
    if "label" in spec:
        return str(spec["label"])
    knobs = ",".join(f"{k}={json.dumps(v) if not isinstance(v, (int, float)) else v}" for k, v in sorted(spec.items()) if k != "policy")
    return f"{spec['policy']}({knobs})" if knobs else str(spec["policy"])


class Portfolio(Policy):
    """Per-arm policies learning side by side; the best by the log's progressive estimate acts
    (see the module docstring).

    Parameters: ``members`` (a list of ``{policy: name, label?: str, <its parameters>}``, at
    least two, per-arm policies only, labels distinct; default :data:`DEFAULT_MEMBERS`); ``level`` (confidence of a switch, in
    (0.5, 1), default :data:`DEFAULT_LEVEL`); ``min_rows`` (logged rows before any switch, and after
    each, default :data:`DEFAULT_MIN_ROWS`) and
    ``min_rows_per_arm`` (as many per arm the portfolio holds, default 20); ``mix``
    (the share of decisions from the other members' distributions, in [0, 1), default 0) and
    ``mix_rule`` (``fixed``, or ``evidence``: see :meth:`mix_shares`); ``rate`` (``greedy``
    or ``policy``: what the log rates each member as, default :data:`DEFAULT_RATE`); ``dim``
    and ``seed`` (member i is seeded ``seed + i``); ``eps0``, ``gamma``, ``prior_mean``,
    ``prior_strength``, ``arm_priors`` given here apply to every member that does not set its own.
    """

    name = "portfolio"
    shared = False

    def __init__(
        self,
        dim: int,
        *,
        members: Sequence[Mapping[str, Any]] = DEFAULT_MEMBERS,
        level: float = DEFAULT_LEVEL,
        min_rows: int = DEFAULT_MIN_ROWS,
        min_rows_per_arm: int = MIN_ROWS_PER_ARM,
        mix: float = 0.0,
        mix_rule: str = "fixed",
        rate: str = DEFAULT_RATE,
        seed: int | None = None,
        **common: Any,
    ) -> None:
        from learner.policies import POLICIES  # the registry lives in the package, which imports us

        self.dim = valid_dim(dim)
        unknown = sorted(set(common) - set(COMMON))
        if unknown:
            raise TypeError(f"unexpected parameter(s) {', '.join(unknown)}; a portfolio takes members, level, min_rows, "
                            f"seed and the members' common {', '.join(COMMON)}")  # fmt: skip
        if isinstance(members, (str, bytes)) or not isinstance(members, Sequence) or len(members) < 2:
            raise ValueError("members must list at least two policies, e.g. [{policy: lin_igw}, {policy: lin_ucb, alpha: 0.3}]")
        if not 0.5 < float(level) < 1.0:
            raise ValueError(f"level must be in (0.5, 1), got {level!r}")
        if isinstance(min_rows, bool) or not isinstance(min_rows, (int, np.integer)) or min_rows < 1:
            raise ValueError(f"min_rows must be a positive int, got {min_rows!r}")
        if isinstance(min_rows_per_arm, bool) or not isinstance(min_rows_per_arm, (int, np.integer)) or min_rows_per_arm < 0:
            raise ValueError(f"min_rows_per_arm must be an int >= 0, got {min_rows_per_arm!r}")
        self.min_rows_per_arm = int(min_rows_per_arm)
        if isinstance(mix, bool) or not isinstance(mix, (int, float)) or not 0.0 <= float(mix) < 1.0:
            raise ValueError(f"mix must be a number in [0, 1), got {mix!r}")
        self.mix = float(mix)
        if mix_rule not in ("fixed", "evidence"):
            raise ValueError(f"mix_rule must be 'fixed' or 'evidence', got {mix_rule!r}")
        self.mix_rule = mix_rule
        if rate not in RATES:
            raise ValueError(f"rate must be one of {', '.join(map(repr, RATES))}, got {rate!r}")
        self.rate = rate
        self.specs = [_member_spec(i, spec) for i, spec in enumerate(members)]
        self.labels = [_label(spec) for spec in self.specs]
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"member labels must be distinct, got {self.labels}; give the members a label")
        self.level = float(level)
        self.min_rows = int(min_rows)
        self.seed = None if seed is None else int(seed)
        self.common = dict(common)
        self.members: list[Policy] = []
        #: member i's feature map (None: it learns on the row itself)
        self.features: list[FourierFeatures | None] = []
        for i, spec in enumerate(self.specs):
            cls = POLICIES.get(spec["policy"])
            if cls is None:
                raise ValueError(f"members[{i}].policy: unknown policy {spec['policy']!r}; known: {', '.join(sorted(POLICIES))}")
            if cls.shared or cls is Portfolio:
                raise ValueError(f"members[{i}].policy: {spec['policy']!r} cannot be a member; members are per-arm policies")
            common = {k: v for k, v in self.common.items() if k not in _WHERE_IT_APPLIES or k in _param_names(cls)}
            params = {**common, **{k: v for k, v in spec.items() if k not in ("policy", "label", *_READ_BY_PORTFOLIO)}}
            if "fourier" in spec and "huber_q" in _param_names(cls) and "huber_q" not in params:
                params["huber_q"] = FOURIER_HUBER_Q
            try:
                features = FourierFeatures(self.dim, spec["fourier"], spec.get("fourier_scale", 1.0)) if "fourier" in spec else None
                dim = self.dim if features is None else features.out_dim
                self.members.append(cls(dim=dim, seed=None if self.seed is None else self.seed + i, **params))
            except (TypeError, ValueError) as exc:
                raise ValueError(f"members[{i}] ({self.labels[i]}): {exc}") from None
            self.features.append(features)
        #: member i's flagged arms also go back to their prior when member _alarms_from[i] flags them
        self._alarms_from = [self._alarm_source(i, spec) for i, spec in enumerate(self.specs)]
        keys = [None if (like := _learns_like(member)) is None else (like, features and features.key, source)
                for member, features, source in zip(self.members, self.features, self._alarms_from)]  # fmt: skip
        #: member i takes its learning from member _leader[i] (itself when none before learns alike)
        self._leader = [keys.index(key) if key is not None else i for i, key in enumerate(keys)]
        self._scoring_only = False
        self.acting = 0
        self.switches: list[dict[str, Any]] = []
        self._clear_selection()
        self._warn_of_order()

    def _warn_of_order(self) -> None:
        """Log each of :meth:`order_warnings` once per process."""
        for key, message in self._order_problems():
            if key not in _WARNED_ORDER:
                _WARNED_ORDER.add(key)
                log.warning("%s", message)

    def order_warnings(self) -> list[str]:
        """Each later member that cannot act or is unlikely to, with its settings (module
        docstring, "What the log rates"): rated greedily, one that learns as an earlier member
        does (it ties with it on every row); rated by the distribution, one that learns as the
        first does and only explores more. ``banditstream doctor`` reports them."""
        return [message for _, message in self._order_problems()]

    def _order_problems(self) -> list[tuple[tuple[str, str], str]]:
        problems = []
        for j in range(1, len(self.members)):
            leader = self._leader[j]
            if self.rate == "greedy":
                if leader != j:
                    problems.append(((self.labels[leader], self.labels[j]), (
                        f"portfolio member {self.labels[j]!r} learns as the earlier {self.labels[leader]!r} does and differs "
                        f"only in how it decides ({_deciding_difference(self.members[leader], self.members[j])}): the log "
                        f"rates what members have learned (rate 'greedy'), so it ties with {self.labels[leader]!r} on every "
                        f"row and never acts; list it first for it to act, or drop it")))  # fmt: skip
            elif leader == 0 and (more := _explores_more(self.members[0], self.members[j])):
                problems.append(((self.labels[0], self.labels[j]), (
                    f"portfolio member {self.labels[j]!r} explores more than the first, {self.labels[0]!r} "
                    f"({', '.join(more)}), and learns from the same rows: the log rates what a member's decisions earn "
                    f"now, and exploring earns less now, so it is unlikely ever to act; list it first for it to act")))  # fmt: skip
        return problems

    def _alarm_source(self, i: int, spec: Mapping[str, Any]) -> int | None:
        """The index of the member named by member i's ``alarms_from`` (None without one): an
        earlier member that runs a change detector."""
        if "alarms_from" not in spec:
            return None
        name = spec["alarms_from"]
        source = self.labels.index(name) if isinstance(name, str) and name in self.labels[:i] else None
        if source is None:
            raise ValueError(f"members[{i}].alarms_from: {name!r} is not the label of an earlier member "
                             f"(the earlier ones: {self.labels[:i]})")  # fmt: skip
        if not getattr(self.members[source], "detect", False):
            raise ValueError(f"members[{i}].alarms_from: member {name!r} runs no change detector")
        return source

    def _clear_selection(self) -> None:
        m = len(self.members)
        self._sel = {
            "select_n": np.zeros((), dtype=np.int64),
            "select_reward": np.zeros(()),
            "select_d": np.zeros(m),
            "select_c": np.zeros((m, m)),
            "select_s": np.zeros(m),
            "select_w": np.zeros(m),
            "select_w2": np.zeros(m),
            "select_e": np.zeros(m),
            "select_rows": np.zeros((), dtype=np.int64),
            "select_range": np.zeros(2),
            "select_kind": np.zeros((), dtype=np.int64),
        }

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        return {"dim": 4, "eps0": 0.1, "seed": 0, "mix": 0.1, "members": [{"policy": "lin_ucb", "alpha": 0.3}, {"policy": "lin_igw"}]}

    def get_params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"dim": self.dim, "members": [dict(spec) for spec in self.specs], "level": self.level,
                                  "min_rows": self.min_rows, "seed": self.seed}  # fmt: skip
        if self.min_rows_per_arm != MIN_ROWS_PER_ARM:
            params["min_rows_per_arm"] = self.min_rows_per_arm
        if self.mix:  # a state without it reads as it was written (mix 0)
            params["mix"] = self.mix
        if self.mix_rule != "fixed":
            params["mix_rule"] = self.mix_rule
        if self.rate != DEFAULT_RATE:
            params["rate"] = self.rate
        for key, value in self.common.items():
            params[key] = {arm: list(p) for arm, p in value.items()} if key == "arm_priors" else value
        return params

    def __repr__(self) -> str:
        return f"Portfolio(acting={self.acting_label!r}, members={self.labels!r})"

    @property
    def acting_member(self) -> Policy:
        return self.members[self.acting]

    @property
    def acting_label(self) -> str:
        return self.labels[self.acting]

    @property
    def eps0(self) -> float:  # type: ignore[override]
        return self.acting_member.eps0

    @property
    def scoring_only(self) -> bool:
        return self._scoring_only

    # --- arms and learning -----------------------------------------------------------------------

    def arm_ids(self) -> list[str]:
        return self.members[0].arm_ids()

    def add_arm(self, arm: Any) -> None:
        if self._scoring_only:
            raise ScoringOnlyError("Portfolio built from a scoring view holds no statistics")
        for member in self.members:
            member.add_arm(arm)

    def prior_of(self, arm: Any) -> Prior:
        return self.acting_member.prior_of(arm)

    def arm_statistics(self, arm: Any) -> dict[str, np.ndarray]:
        return self.acting_member.arm_statistics(arm)

    def expected_rewards(self, X: np.ndarray, arms: Sequence[Any]) -> np.ndarray:
        return self.acting_member.expected_rewards(self._rows_of(self.acting, X), arms)

    def _rows_of(self, m: int, X: np.ndarray) -> np.ndarray:
        """Member m's rows of ``X``: the rows themselves, or its feature map's."""
        features = self.features[m]
        return X if features is None else features(self._check_rows(X, "X"))

    def _member_rows(self, X: np.ndarray) -> list[np.ndarray]:
        """Every member's rows of ``X`` (:meth:`_rows_of`), each feature map computed once."""
        mapped: dict[tuple, np.ndarray] = {}
        out = []
        for m, features in enumerate(self.features):
            if features is not None and features.key not in mapped:
                mapped[features.key] = self._rows_of(m, X)
            out.append(X if features is None else mapped[features.key])
        return out

    def update_count(self, arm: Any) -> int:
        return self.members[0].update_count(arm)

    def update_batch(self, X: np.ndarray, arms: Sequence[Any], rewards: Any, weights: Any = None, times: Any = None) -> list[str]:
        """Every member learns the batch; the touched arm ids (the same for every member)."""
        if self._scoring_only:
            raise ScoringOnlyError("Portfolio built from a scoring view cannot learn")
        for member in self.members[1:]:  # every member's check before any member learns
            member._check_times(times, len(rewards))
        rows = self._member_rows(X)
        watched = {s for s in self._alarms_from if s is not None}
        before = {s: self._alarm_counts(s, dict.fromkeys(arms)) for s in watched}
        touched = self.members[0].update_batch(rows[0], arms, rewards, weights, times)
        for i, member in enumerate(self.members[1:], 1):
            source = self._alarms_from[i]
            if source is not None:  # the source learned the batch before this member does
                now = self._alarm_counts(source, touched)
                flagged = [arm for arm, alarms in now.items() if alarms > before[source].get(arm, 0)]
                flagged = self._confirmed(member, flagged, rows[i], arms, rewards, weights)
                if flagged:
                    slots = np.array([member._slot_of(arm) for arm in flagged], dtype=np.intp)
                    member._forget(slots, np.zeros(len(flagged)))
                    member._restart_scales(slots)  # its residuals' scales were the discarded model's
            if self._leader[i] == i:
                member.update_batch(rows[i], arms, rewards, weights, times)
            else:
                _take_learning(self.members[self._leader[i]], member, touched)
        return touched

    @staticmethod
    def _confirmed(member: Policy, flagged: list[str], X: np.ndarray, arms: Sequence[Any], rewards: Any, weights: Any) -> list[str]:
        """Those of ``flagged`` (another member's alarms) that ``member``'s own residuals on the
        batch confirm, or cannot test: an arm with fewer than ``CONFIRM_ROWS`` of the batch's rows
        is taken on trust. See ``CONFIRM_T``."""
        means_of = getattr(member, "_means_of", None)
        if not flagged or means_of is None:
            return flagged
        canon = [canonical_arm(arm) for arm in arms]
        r = np.asarray(rewards, dtype=np.float64)
        learned = np.ones(len(canon), dtype=bool) if weights is None else np.asarray(weights, dtype=np.float64) > 0.0
        confirmed = []
        for arm in flagged:
            rows = np.flatnonzero(learned & np.fromiter((c == arm for c in canon), dtype=bool, count=len(canon)))
            n, slot = len(rows), member._slot.get(arm)
            if n < CONFIRM_ROWS or slot is None:
                confirmed.append(arm)
                continue
            theta = means_of(np.array([slot], dtype=np.intp))[0]
            e = r[rows] - _row_dots(X[rows], np.broadcast_to(theta, (n, len(theta))))
            mean = _sequential_sum(e) / n
            spread = _sequential_sum((e - mean) ** 2) / (n - 1)
            if mean * mean * n > CONFIRM_T * CONFIRM_T * spread:  # |t| > CONFIRM_T
                confirmed.append(arm)
        return confirmed

    def _alarm_counts(self, m: int, arms: Any) -> dict[str, int]:
        """Member m's detector alarms so far on each of ``arms`` (by canonical id; 0 for an arm it
        has not seen)."""
        member = self.members[m]
        counts = {}
        for arm in arms:
            canon = canonical_arm(arm)
            slot = member._slot.get(canon)
            counts[canon] = 0 if slot is None else member._alarms(slot)
        return counts

    # --- deciding --------------------------------------------------------------------------------

    def probabilities(self, X: np.ndarray, arms: Sequence[Any], rng: np.random.Generator | int | None = None) -> Choice:
        """The acting member's distribution and draw (with ``mix``, the mixture's); a new
        candidate arm enters every member."""
        acting = self.acting_member
        known = len(acting.arm_ids())
        if self.mix:
            gen = acting._generator(rng)
            shares = self.mix_shares()
            p = acting.probabilities(self._rows_of(self.acting, X), arms, gen).probabilities * (1.0 - math.fsum(shares.tolist()))
            for m, member in enumerate(self.members):
                if shares[m] > 0.0:
                    p += shares[m] * member.probabilities(self._rows_of(m, X), arms, gen).probabilities
            chosen = draw_index(p, gen.random())
            choice = Choice(p, chosen, float(p[chosen]))
        else:
            choice = acting.probabilities(self._rows_of(self.acting, X), arms, rng)
        if len(acting.arm_ids()) != known:
            for arm in acting.arm_ids()[known:]:
                for member in self.members:
                    if member is not acting:
                        member._slot_of(arm)
        return choice

    def rows_before_switching(self) -> int:
        """Logged rows before a switch may happen: ``min_rows``, and ``min_rows_per_arm`` per arm held."""
        return max(self.min_rows, self.min_rows_per_arm * len(self.arm_ids()))

    def mix_shares(self) -> np.ndarray:
        """Each member's share of the decisions besides the acting one's (0 for the acting
        member): ``mix / (M - 1)`` each; with ``mix_rule = "evidence"``, once a switch may
        happen (:meth:`rows_before_switching`), scaled by ``min(1, 2 P(gain > 0))`` of its
        estimated gain over the acting member (normal approximation), so a member the log rates
        clearly worse takes almost none, and one it cannot tell apart, or whose estimate is too
        uncertain to, its full share."""
        m = len(self.members)
        shares = np.full(m, self.mix / (m - 1))
        shares[self.acting] = 0.0
        if self.mix_rule == "evidence" and int(self._sel["select_n"]) >= self.rows_before_switching():
            gain, se = self._gains()
            for i in range(m):
                if i != self.acting:
                    z = gain[i] / se[i] if se[i] > 0.0 else (math.inf if gain[i] >= 0.0 else -math.inf)
                    shares[i] *= min(1.0, 2.0 * NormalDist().cdf(z))
        return shares

    def alarms(self, arm: Any) -> int:
        return self.acting_member.alarms(arm)

    @property
    def clock(self) -> int | None:  # type: ignore[override]
        """The newest event time any member's arm has been brought to (members forgetting by time)."""
        clocks = [c for c in (member.clock for member in self.members) if c is not None]
        return max(clocks) if clocks else None

    def age(self, to_ms: int | None = None) -> list[str]:
        """Every member that forgets by time brings its arms to ``to_ms`` (default the newest clock)."""
        to = self.clock if to_ms is None else to_ms
        return sorted({arm for member in self.members for arm in member.age(to)})

    def drift(self, arm: Any) -> Drift:
        return self.acting_member.drift(arm)

    def scoring_arrays(self, arm: Any) -> dict[str, np.ndarray]:
        """The acting member's arrays, and every member's prefixed ``m<i>.`` (with its ``count``;
        members that learn alike once), which :meth:`from_scoring` reads back."""
        out = dict(self.acting_member.scoring_arrays(arm))
        for m, member in self._learners():
            out.update((f"m{m}.{name}", value) for name, value in member.scoring_arrays(arm).items())
            out[f"m{m}.count"] = np.asarray(member.update_count(arm))
        return out

    @classmethod
    def from_scoring(cls, params: Mapping[str, Any], arms: Mapping[str, Mapping[str, np.ndarray]]) -> Policy:
        """A scoring-only portfolio from :meth:`scoring_arrays`: every member's, first acting.
        Arrays without the members' (a single policy's) go to the first member, the others
        start at their priors."""
        portfolio = cls(**params)
        every = bool(arms) and all("m0.count" in arrays for arrays in arms.values())
        for i, member in enumerate(portfolio.members):
            if every or i == 0:
                source = {arm: _of_member(arrays, portfolio._leader[i]) if every else arrays for arm, arrays in arms.items()}
                portfolio.members[i] = type(member).from_scoring(member.get_params(), source)
            else:
                portfolio.members[i] = member.scoring_view()
                for arm in arms:
                    portfolio.members[i]._slot_of(arm)
        portfolio._scoring_only = True
        return portfolio

    def scoring_view(self) -> Policy:
        view = Portfolio(**self.get_params())
        view.members = [member.scoring_view() for member in self.members]
        view._scoring_only = True
        view._adopt(self)
        return view

    # --- choosing who acts -----------------------------------------------------------------------

    def score(
        self, contexts: np.ndarray, candidates: Sequence[Sequence[Any]], chosen: Sequence[int], rng: np.random.Generator | int = 0
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every member's view of logged rows, ``contexts[i]`` shown to the arms
        ``candidates[i]`` of which ``chosen[i]`` was taken: ``(pi, rhat)``, both ``(n, M, K)``
        for K the most candidates of a row (zero past a row's own): the policy member m is
        rated as, and its model's expected reward of each candidate. With ``rate`` ``greedy``
        the policy is the member's greedy choice (1 on the candidate its model rates highest,
        the first of ties); with ``policy``, its decide step's probabilities (floor included;
        Thompson sampling's by its seeded draws)."""
        contexts = np.asarray(contexts, dtype=np.float64).reshape(len(chosen), self.dim)
        rows = self._member_rows(contexts)
        sizes = np.fromiter((len(arms) for arms in candidates), dtype=np.intp, count=len(candidates))
        width = int(sizes.max(initial=0))
        pi = np.zeros((len(contexts), len(self.members), width))
        rhat = np.zeros_like(pi)
        # the predictions in one call per member: row i once for each of its candidates
        row_of = np.repeat(np.arange(len(candidates)), sizes)
        position = np.arange(len(row_of)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        flat_arms = [arm for arms in candidates for arm in arms]
        for m, member in enumerate(self.members):
            rhat[row_of, m, position] = member.expected_rewards(rows[m][row_of], flat_arms)
        rhat = np.nan_to_num(rhat)
        if self.rate == "greedy":
            past = np.arange(width)[None, None, :] >= sizes[:, None, None]
            best = np.where(past, -np.inf, rhat).argmax(axis=2)  # (n, M): the first of ties
            np.put_along_axis(pi, best[:, :, None], 1.0, axis=2)
            return pi, rhat
        gen = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
        for i, arms in enumerate(candidates):
            K = len(arms)
            candidates_of: dict[int, np.ndarray] = {}  # members on the same rows share them
            for m, member in enumerate(self.members):
                X = candidates_of.get(id(rows[m]))
                if X is None:
                    x = rows[m][i]
                    X = candidates_of[id(rows[m])] = np.ascontiguousarray(np.broadcast_to(x, (K, len(x))))
                pi[i, m, :K] = member.probabilities(X, arms, gen).probabilities
        return pi, rhat

    def reward_model(self) -> int:
        """The member whose predictions serve as the estimate's reward model: the one with the
        least error on the logged rewards (each predicted before it learned the row), squared
        up to :meth:`_error_bound` and linear past it, recent rows weighing most
        (:data:`ERROR_DECAY`); the acting member before any row."""
        errors = self._sel["select_e"]
        return self.acting if not int(self._sel["select_rows"]) else int(np.argmin(errors))

    def _note_rewards(self, r: np.ndarray) -> None:
        """Fold logged rewards into the least and greatest seen and whether another value came
        (``select_range``, ``select_kind``; :data:`ERROR_BOUND`)."""
        s = self._sel
        kind = int(s["select_kind"])
        if kind == 2 or not len(r):
            return
        lo, hi = float(r.min()), float(r.max())
        before = s["select_range"].tolist() if kind == 1 else []
        lo, hi = min([lo, *before]), max([hi, *before])
        two = bool(((r == lo) | (r == hi)).all()) and all(v in (lo, hi) for v in before)
        s["select_range"] = np.array([lo, hi])
        s["select_kind"] = np.array(1 if two else 2, dtype=np.int64)

    def _error_bound(self) -> float | None:
        """Where a member's error on a logged reward starts to count linearly: :data:`ERROR_BOUND`
        times the acting member's root mean (decayed) error on the rows before; None (squared
        throughout) while the rewards logged took at most two values, before any row, or while
        that error is zero."""
        s = self._sel
        rows, error = int(s["select_rows"]), float(s["select_e"][self.acting])
        if int(s["select_kind"]) != 2 or not rows or not error > 0.0:
            return None
        weight = (1.0 - ERROR_DECAY**rows) / (1.0 - ERROR_DECAY)  # the decayed count of those rows
        return ERROR_BOUND * math.sqrt(error / weight)

    def observe(
        self, pi: np.ndarray, rhat: np.ndarray, chosen: Sequence[int], propensities: Sequence[float], rewards: Sequence[float]
    ) -> None:
        """Add logged rows scored by :meth:`score` (by models that had not learned them) to
        every member's doubly robust value (module docstring); ``chosen`` the position of the
        action taken among each row's candidates, ``propensities`` its logged probability."""
        pi = np.asarray(pi, dtype=np.float64)
        rhat = np.asarray(rhat, dtype=np.float64)
        k = np.asarray(chosen, dtype=np.intp)
        p = np.asarray(propensities, dtype=np.float64)
        r = np.asarray(rewards, dtype=np.float64)
        n, M = len(k), len(self.members)
        if pi.ndim != 3 or pi.shape[:2] != (n, M) or rhat.shape != pi.shape or p.shape != (n,) or r.shape != (n,):
            raise ValueError(f"observe needs (n, {M}, K) member probabilities and predictions, n choices, propensities and rewards")
        if not (np.isfinite(pi).all() and np.isfinite(rhat).all() and np.isfinite(r).all() and (p > 0).all() and (p <= 1).all()):
            raise ValueError("observe needs finite probabilities, predictions and rewards, and propensities in (0, 1]")
        if not n or ((k < 0) | (k >= pi.shape[2])).any():
            if n:
                raise ValueError("observe needs each chosen position among its row's candidates")
            return
        s = self._sel
        rows = np.arange(n)
        model = rhat[:, self.reward_model(), :]  # (n, K): one reward model for every member, so differences pair
        w = pi[rows, :, k] / p[:, None]  # (n, M)
        corrected = np.where(w <= SWITCH_WEIGHT, w, 0.0)  # past it, the model's prediction alone (switch-DR)
        value = np.einsum("nmk,nk->nm", pi, model) + corrected * (r - model[rows, k])[:, None]
        # less the mean reward of the rows before (the same for every member: the differences do
        # not move), so the second moments hold the spread, not the reward's level squared
        value -= float(s["select_reward"]) / int(s["select_n"]) if int(s["select_n"]) else 0.0
        s["select_d"] += value.sum(axis=0)
        s["select_c"] += value.T @ value
        s["select_s"] += w.T @ r
        s["select_w"] += w.sum(axis=0)
        s["select_w2"] += (w * w).sum(axis=0)
        error = np.abs(rhat[rows, :, k] - r[:, None])
        self._note_rewards(r)
        bound = self._error_bound()
        # Huber's loss c (2 e - c), c = min(e, bound): e^2 up to the bound (exactly: 2e - e is e)
        held = np.minimum(error, math.inf if bound is None else bound)
        error = held * (2.0 * error - held)
        keep = ERROR_DECAY ** np.arange(n - 1, -1, -1, dtype=np.float64)  # row j's error counts decay^(rows after it)
        s["select_e"] *= ERROR_DECAY**n
        s["select_e"] += keep @ error
        s["select_n"] += n
        s["select_rows"] += n
        s["select_reward"] += math.fsum(r.tolist())

    def judge(
        self,
        contexts: np.ndarray,
        candidates: Sequence[Sequence[Any]],
        chosen: Sequence[int],
        propensities: Sequence[float],
        rewards: Sequence[float],
        *,
        scored_by: "Portfolio | None" = None,
        rng: np.random.Generator | int = 0,
    ) -> dict[str, Any] | None:
        """:meth:`score` logged rows by ``scored_by`` (default this portfolio: models that have
        not learned the rows yet), :meth:`observe` them, :meth:`select`; the switch or None."""
        scorer = self if scored_by is None else scored_by
        pi, rhat = scorer.score(contexts, candidates, chosen, rng)
        self.observe(pi, rhat, chosen, propensities, rewards)
        return self.select()

    def _gains(self) -> tuple[np.ndarray, np.ndarray]:
        """Each member's estimated gain over the acting member per row, and its standard error."""
        s, a = self._sel, self.acting
        n = max(int(s["select_n"]), 1)
        d, c = s["select_d"], s["select_c"]
        gain = (d - d[a]) / n
        second = (np.diag(c) - 2.0 * c[:, a] + c[a, a]) / n
        return gain, np.sqrt(np.maximum(second - gain * gain, 0.0) / n)

    def select(self) -> dict[str, Any] | None:
        """Switch to the member whose gain's lower bound is highest and above zero (after
        :meth:`rows_before_switching` rows); the switch as recorded, or None when the acting
        member stays."""
        n = int(self._sel["select_n"])
        if n < self.rows_before_switching():
            return None
        gain, se = self._gains()
        lower = gain - NormalDist().inv_cdf(self.level) * se
        lower[self.acting] = -math.inf
        best = int(np.argmax(lower))
        if not lower[best] > 0.0:
            return None
        switch = {"from": self.acting_label, "to": self.labels[best], "rows": int(self._sel["select_rows"]),
                  "gain": float(gain[best]), "lower": float(lower[best])}  # fmt: skip
        self.acting = best
        self.switches = [*self.switches, switch][-MAX_SWITCHES:]
        _restart_evidence(self._sel)  # the new acting member is judged from here on
        return switch

    def estimates(self) -> list[dict[str, Any]]:
        """Per member: its label, whether it acts, the self-normalised value of its choices on
        the log, effective sample size, and its estimated gain over the acting member with the
        lower bound at ``level``."""
        s = self._sel
        gain, se = self._gains()
        z = NormalDist().inv_cdf(self.level)
        out = []
        for m, label in enumerate(self.labels):
            w, w2 = float(s["select_w"][m]), float(s["select_w2"][m])
            out.append({
                "member": label, "acting": m == self.acting,
                "value": float(s["select_s"][m]) / w if w > 0 else None,
                "ess": w * w / w2 if w2 > 0 else 0.0,
                "gain": float(gain[m]), "lower": float(gain[m] - z * se[m]),
            })  # fmt: skip
        return out

    @property
    def rows_seen(self) -> int:
        return int(self._sel["select_rows"])

    def _adopt(self, other: "Portfolio") -> None:
        """Take ``other``'s choice of who acts and its evidence (same members required)."""
        if other.labels != self.labels:
            raise ValueError(f"portfolio members differ: {other.labels} vs {self.labels}")
        self.acting = other.acting
        self.switches = list(other.switches)
        self._sel = {name: value.copy() for name, value in other._sel.items()}
        if other.rate != self.rate:  # its evidence rated the members otherwise: it does not add to this one's
            _restart_evidence(self._sel)

    def adopt_selection(self, previous: Policy) -> bool:
        """Carry the acting member and the evidence from ``previous`` (e.g. the last snapshot's
        portfolio) into this one; False when ``previous`` is not a portfolio of these members."""
        if not isinstance(previous, Portfolio) or previous.labels != self.labels:
            return False
        self._adopt(previous)
        return True

    # --- bytes -----------------------------------------------------------------------------------

    def _check_carried(self, arrays: Mapping[str, np.ndarray]) -> None:
        """A blob carries the arrays of exactly the members that learn on their own."""
        carried = {name.split(".", 1)[0] for name in arrays if name not in _SELECTION}
        wanted = {f"m{m}" for m, _ in self._learners()}
        if carried != wanted:
            raise StateFormatError(f"portfolio state carries members {sorted(carried)}, these members need {sorted(wanted)}")

    def _learners(self) -> list[tuple[int, Policy]]:
        """The members whose arrays the bytes carry: a member that learns alike with an earlier
        one holds the same arrays, bit for bit (see the module docstring), and loads the earlier
        one's."""
        return [(m, member) for m, member in enumerate(self.members) if self._leader[m] == m]

    def _view(self) -> str:
        return "scoring" if self._scoring_only else "full"

    def to_bytes(self) -> bytes:
        arms = self.arm_ids()
        arrays: dict[str, np.ndarray] = dict(self._sel)
        for m, member in self._learners():
            slots = np.array([member._existing_slot(a) for a in arms], dtype=np.intp)
            arrays.update((f"m{m}.{name}", value) for name, value in member._view_arrays(slots).items())
        header = {"policy": self.name, "kind": "policy", "view": self._view(), "dim": self.dim, "params": self.get_params(),
                  "arms": arms, "acting": self.acting, "switches": self.switches, "rated": self.rate}  # fmt: skip
        return _encode(header, arrays)

    @classmethod
    def _from_decoded(cls, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Policy:
        params, arms, view = header.get("params"), header.get("arms"), header.get("view")
        if not isinstance(params, dict) or not isinstance(arms, list) or not all(isinstance(a, str) for a in arms):
            raise StateFormatError("policy header lacks params or arms")
        if view not in ("full", "scoring"):
            raise StateFormatError(f"unknown view {view!r}")
        try:
            portfolio = cls(**params)
        except (TypeError, ValueError) as exc:
            raise StateFormatError(f"parameters in the header do not build Portfolio: {exc}") from exc
        if header.get("dim") != portfolio.dim:
            raise StateFormatError(f"header dim {header.get('dim')!r} disagrees with params dim {portfolio.dim}")
        if len(set(arms)) != len(arms):
            raise StateFormatError("duplicate arm ids in the header")
        acting, switches = header.get("acting"), header.get("switches")
        if not isinstance(acting, int) or not 0 <= acting < len(portfolio.members) or not isinstance(switches, list):
            raise StateFormatError("portfolio header lacks its acting member or switches")
        m = len(portfolio.members)
        for name, shape in zip(_SELECTION, [(), (), (m,), (m, m), (m,), (m,), (m,), (m,), (), (2,), ()]):
            value = arrays.get(name, np.zeros(shape) if name in _SELECTION_SINCE else None)
            if value is None or value.shape != shape or not np.isfinite(value).all():
                raise StateFormatError(f"portfolio state lacks a valid {name!r}")
            portfolio._sel[name] = value.astype(portfolio._sel[name].dtype)
        if int(portfolio._sel["select_kind"]) not in (0, 1, 2):
            raise StateFormatError(f"portfolio state has reward kind {int(portfolio._sel['select_kind'])}; known: 0, 1, 2")
        if "select_rows" not in arrays:  # a state from before the evidence restarted at a switch: it never did
            portfolio._sel["select_rows"] = portfolio._sel["select_n"].copy()
        rated = header.get("rated")
        if rated is not None and rated not in RATES:
            raise StateFormatError(f"portfolio state rated its members by {rated!r}; known: {', '.join(RATES)}")
        if rated != portfolio.rate:  # evidence of another rating, or of an unsaid one (written before it was), does not add
            _restart_evidence(portfolio._sel)
        portfolio._check_carried(arrays)
        portfolio.acting, portfolio.switches = acting, switches
        portfolio._scoring_only = view == "scoring"
        for i, member in enumerate(portfolio.members):
            member._scoring_only = portfolio._scoring_only
            slots = np.array([member._slot_of(a) for a in arms], dtype=np.intp)
            member._load_view(slots, _of_member(arrays, portfolio._leader[i]), view, count=None)
        return portfolio

    def arm_states_bytes(self, arms: Sequence[Any]) -> list[bytes]:
        """Each arm's members' states in one blob (arrays ``m<i>.<name>``), every member's
        arrays read for all the arms at once."""
        canons = [canonical_arm(arm) for arm in arms]
        stacked: dict[str, np.ndarray] = {}
        for m, member in self._learners():
            slots = np.array([member._existing_slot(arm) for arm in canons], dtype=np.intp)
            stacked.update((f"m{m}.{name}", value) for name, value in member._view_arrays(slots).items())
        header = {"policy": self.name, "kind": "arm", "view": self._view(), "dim": self.dim, "members": self.labels}
        return _encode_arms(header, canons, stacked)

    def load_arm_state(self, arm: Any, data: bytes) -> None:
        """Every member's state of one arm from :meth:`arm_state_bytes`; all or nothing.

        A state learned by some of these members (a portfolio that has since gained members, as
        the default did) loads into them, and the members it does not name start the arm at their
        prior."""
        header, arrays = _decode(data)
        canon = self._check_arm_header(header, arm)
        learned_by = header.get("members")
        renamed: set[int] = set()
        if isinstance(learned_by, list) and learned_by != self.labels:  # a renamed member loads as the new one
            renamed = {j for j, label in enumerate(learned_by)
                       if isinstance(label, str) and label not in self.labels and _RENAMED.get(label) in self.labels}  # fmt: skip
            learned_by = [_RENAMED[label] if j in renamed else label for j, label in enumerate(learned_by)]
        if learned_by == self.labels:
            self._check_carried(arrays)
            sources = {i: self._leader[i] for i in range(len(self.members))}
        else:
            carried = {name.split(".", 1)[0] for name in arrays if name not in _SELECTION}
            if not (isinstance(learned_by, list) and learned_by and set(learned_by) <= set(self.labels)
                    and all(f"m{j}" in carried for j in range(len(learned_by)))):  # fmt: skip
                raise StateFormatError(f"state was learned by members {learned_by!r}, this portfolio has {self.labels!r}; "
                                       "name those members in params.members to keep it (the default members changed on 2026-11-28)")  # fmt: skip
            sources = {self.labels.index(label): j for j, label in enumerate(learned_by)}
        held = [member.arm_state_bytes(canon) if canon in member._slot else None for member in self.members]
        done: list[int] = []
        try:
            for i, member in enumerate(self.members):
                if i not in sources:
                    member._slot_of(canon)
                    continue
                own = _of_member(arrays, sources[i])
                if sources[i] in renamed:  # it has since lost its detector: the rest is its state
                    detector = member._detector_specs()
                    own = {name: value for name, value in own.items() if not name.startswith("detect_") or name in detector}
                stacked = {name: value[None, ...] for name, value in own.items()}
                member._load_view(np.array([member._slot_of(canon)]), stacked, self._view(), count=None)
                done.append(i)
        except StateFormatError:
            for i in done:  # all or nothing: the members already loaded get their old state back
                if held[i] is not None:
                    self.members[i].load_arm_state(canon, held[i])
            raise

    def adopts(self, policy: str) -> bool:
        """Whether :meth:`adopt_arm_state` takes an arm state learned by ``policy`` alone."""
        return any(member.name == policy and features is None for member, features in zip(self.members, self.features))

    def adopt_arm_state(self, arm: Any, policy: str, data: bytes) -> None:
        """One arm's state learned by ``policy`` alone (the domain's model before it became this
        portfolio, e.g. ``lin_igw`` when that was the default): every member of that policy takes
        it as its own (one that forgets forgets from there on), the others start the arm at their
        prior. All or nothing; StateFormatError when no member is of that policy or the state
        does not fit them."""
        takers = [i for i, member in enumerate(self.members) if member.name == policy and self.features[i] is None]
        if not takers:
            raise StateFormatError(f"no member of this portfolio is a {policy!r} ({', '.join(self.labels)})")
        canon = canonical_arm(arm)
        for i in takers:  # on a scratch copy first: a state that does not fit changes nothing
            member = self.members[i]
            type(member)(**member.get_params()).load_arm_state(canon, data)
        for i in takers:
            self.members[i].load_arm_state(canon, data)
        for member in self.members:
            member._slot_of(canon)  # the arm exists in every member, at its prior where not taken


def _learns_like(member: Policy) -> tuple | None:
    """What decides a per-arm linear member's learning (its class's learning code is
    LinearPolicy's and the detector's, whichever rule it decides by); None for other policies."""
    from learner.policies import LinIGW, LinTS, LinUCB

    if not isinstance(member, (LinIGW, LinTS, LinUCB)):
        return None
    return tuple(sorted((k, json.dumps(v, sort_keys=True)) for k, v in member.get_params().items() if k not in _DECIDING))


def _explores_more(first: Policy, later: Policy) -> list[str]:
    """The settings in which ``later`` explores more than ``first``, both of one class (e.g.
    ``["alpha 1 > 0.3"]``); empty when it explores less in any, or the classes differ."""
    if type(first) is not type(later):
        return []
    more, less = [], False
    for name, sign in _EXPLORING:
        a, b = _setting(first, name), _setting(later, name)
        if a is None or b is None or a == b:
            continue
        if (b - a) * sign > 0:
            more.append(f"{name} {b:g} {'>' if sign > 0 else '<'} {a:g}")
        else:
            less = True
    return [] if less else more


def _setting(member: Policy, name: str) -> float | None:
    """A deciding setting's value; ``lin_igw``'s unset ``alpha`` as it is up to ten candidates."""
    value = getattr(member, name, None)
    if value is None and name == "alpha" and hasattr(member, "alpha_for"):
        return member.alpha_for(1)
    return value


def _deciding_difference(first: Policy, later: Policy) -> str:
    """The deciding settings in which two members that learn alike differ, e.g. ``alpha 1.0 against unset``."""
    a, b = first.get_params(), later.get_params()
    shown = lambda value: "unset" if value is None else json.dumps(value)  # noqa: E731
    both = sorted((_DECIDING - {"seed"}) & set(a) & set(b))  # another rule's own settings go without saying
    changed = [f"{k} {shown(b[k])} against {shown(a[k])}" for k in both if a[k] != b[k]]
    if first.name != later.name:  # per-arm linear policies of different rules learn alike too
        changed.insert(0, f"policy {later.name} against {first.name}")
    return ", ".join(changed) or "nothing"


def _take_learning(source: Policy, target: Policy, arms: Sequence[str]) -> None:
    """``target`` learns what ``source`` just learned on ``arms`` (both learn alike): the same
    statistics, counts and detector state, and its derived factors go stale as its own would."""
    src = np.array([source._existing_slot(a) for a in arms], dtype=np.intp)
    dst = np.array([target._slot_of(a) for a in arms], dtype=np.intp)
    counts = source._arrays["count"][src] - target._arrays["count"][dst]
    for name in (*source._stat_names, "count", *source._detector_specs(), *source._clock_specs(), *source._robust_specs()):
        target._arrays[name][dst] = source._arrays[name][src]
    target._invalidate(dst, counts)


def _of_member(arrays: Mapping[str, np.ndarray], index: int) -> dict[str, np.ndarray]:
    prefix = f"m{index}."
    return {name[len(prefix):]: value for name, value in arrays.items() if name.startswith(prefix)}


def describe_state(data: bytes) -> dict[str, Any] | None:
    """Who acts in a whole-portfolio blob (a snapshot's policy state), its members and its
    switches; None for another policy's blob."""
    header, _ = _decode(data)
    if header.get("policy") != Portfolio.name or header.get("kind") != "policy":
        return None
    members = [_label(_member_spec(i, spec)) for i, spec in enumerate(header["params"]["members"])]
    return {"acting": members[header["acting"]], "members": members, "switches": list(header["switches"])}
