"""What every bandit policy shares: arms, priors, forgetting, batching, the floor, rng, bytes.

A policy module implements only its core (which statistics an arm keeps, how a batch adds to
them, how candidates are scored); :class:`Policy` owns the mechanics, in the order they run:

1. **Arms.** Ids are strings (ints are accepted as aliases of their decimal string, so
   ``3`` and ``"3"`` are one arm). An arm first seen among the candidates of
   :meth:`~Policy.probabilities`, or in a batch, enters at its prior.
2. **Priors.** ``prior_mean`` and ``prior_strength`` (pseudo-observations) for every arm, with
   per-arm overrides in ``arm_priors = {arm: (mean, strength)}``. Each policy documents what its
   prior statistics are (linear: ``A0 = strength * I``, ``b0 = strength * mean * e_0``).
3. **Batches and forgetting.** :meth:`~Policy.update_batch` groups rows by arm (one stable sort)
   and applies each arm's rows as one rank-k update. With forgetting ``gamma`` in (0, 1], every
   *row* an arm learns first discounts that arm's statistics toward its prior::

       S <- gamma * S + (1 - gamma) * S0 + w * f(x, r)          (one row)

   so k rows of one arm in a batch are, exactly as k sequential updates,::

       S <- gamma^k * S + (1 - gamma^k) * S0 + sum_i gamma^(k-i) * w_i * f(x_i, r_i)

   ``gamma`` is counted in the arm's own updates: an arm that is not played keeps what it
   knew. **Forgetting by event time**, ``half_life_s`` (seconds; None, the default, never
   forgets by time), counts instead in the time the domain's events carry (the decision's
   timestamp, never a clock of the machine), the same for every arm, played or not: each arm
   keeps the event time it was last brought to (its ``clock``, epoch milliseconds), and a row
   of time ``t`` first brings it to ``T = max(clock, t)``::

       S <- S0 + 2^(-(T - clock) / h) * (S - S0)          (h = half_life_s, in ms)

   and is added with weight ``w * 2^(-(T - t) / h)`` (a row older than the clock as though it
   had been learned at its time and decayed since), so a batch's rows of one arm are, to
   rounding, those rows learned one by one in any order. An arm nobody plays is brought to the
   domain's newest time when a snapshot is made (:meth:`~Policy.age`, in
   :meth:`~Policy.scoring_view`): its estimate relaxes toward its prior and its uncertainty
   grows, so the policy explores it again, while the learner's state of it waits, untouched,
   for its next row (each arm has one writer, see DESIGN). The two compose with each other and
   with a detector's discount. Pulling toward the prior rather than toward zero keeps a
   forgotten precision invertible.
   A policy with a change detector (the per-arm linear ones, ``learner/policies/_detect.py``)
   first runs it over the batch, on the model as the batch finds it, and discounts each arm it
   flags the same way, ``S <- S0 + keep * (S - S0)``, before the batch is added. The
   detector's per-arm state is serialised with the arm's (both views; absent in a blob written
   before it: it starts fresh) but is no statistic: it never changes how a decision is made.
4. **Deciding.** :meth:`~Policy.probabilities` asks the policy for its distribution over the K
   candidates, mixes in the exploration floor ``p = (1 - eps0) * p_policy + eps0 / K`` and draws
   the choice from that very distribution with the rng, so the reported probability of the
   chosen action is the probability it was drawn with.
5. **Bytes.** :meth:`~Policy.to_bytes` / :meth:`~Policy.from_bytes` for a whole policy and
   :meth:`~Policy.arm_state_bytes` / :meth:`~Policy.load_arm_state` for one arm (one store value
   per (domain, arm)). Layout, all little-endian::

       magic b"BSPS" | major u8 | minor u8 | reserved u16 | header length u32
       | header: UTF-8 JSON {policy, kind, view, dim, arrays: [[name, dtype, shape], ...], ...}
       | zero padding to 8 bytes | raw arrays in header order | CRC-32 of all preceding bytes u32

   Only ``<f8`` and ``<i8`` arrays, no pickle. Anything else raises :class:`StateFormatError`.
   Besides its statistics, a full view carries the derived arrays that are state at the time
   (the shared linear models' factor after in-place updates; see ``_linear``), all or none.
6. **Scoring view.** :meth:`~Policy.scoring_view` builds a policy that holds only what deciding
   needs (for linear policies the posterior mean and covariance factor per arm), so the SDK
   scores without inverting anything; it serialises like any policy and refuses to learn.

    >>> import numpy as np
    >>> from learner.policies import make_policy
    >>> policy = make_policy("lin_ucb", dim=3, alpha=1.0, eps0=0.1, seed=7)
    >>> X = np.array([[1.0, 0.2, -0.1], [1.0, 0.5, 0.3]])
    >>> policy.update_batch(X, ["a", "b"], [1.0, 0.0])
    ['a', 'b']
    >>> choice = policy.probabilities(np.array([[1.0, 0.1, 0.0]] * 2), ["a", "b"])
    >>> round(float(choice.probabilities.sum()), 12), bool(choice.probabilities.min() >= 0.1 / 2)
    (1.0, True)
    >>> type(policy).from_bytes(policy.to_bytes()).arm_ids()
    ['a', 'b']
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import struct
import threading
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np

from learner.linalg import pack_symmetric, packed_size, unpack_symmetric
from learner.policies.errors import ScoringOnlyError, StateFormatError

try:
    from learner import _fastscore
except ImportError:  # not built (a source tree without a compiler): numpy does it all
    _fastscore = None

__all__ = ["FORMAT_MAJOR", "SHARED_ARM", "Block", "Choice", "Drift", "Policy", "Prior", "canonical_arm"]

#: The arm id under which a model shared across arms keeps its one state.
SHARED_ARM = ""

_MAGIC = b"BSPS"
FORMAT_MAJOR = 1
#: A reader reads every minor of its major. Minor 1 adds a change detector's per-arm arrays
#: (``detect_*``), optional: a minor-0 blob loads with the detector fresh, while a minor-0
#: reader refuses a blob that carries them (it knows no such arrays, nor the ``detect``
#: parameters), so readers (SDKs, publishers) upgrade before the learners that write them.
#: Minor 2 adds the per-arm ``clock`` of a policy that forgets by event time (``half_life_s``),
#: in the same way: only such a policy's blobs carry it, and older readers refuse those.
FORMAT_MINOR = 2
#: The clock of an arm that has learned no timed row yet.
NEVER = np.iinfo(np.int64).min
_HEAD = struct.Struct("<4sBBHI")
_CRC = struct.Struct("<I")
_DTYPES = {"<f8": np.dtype("<f8"), "<i8": np.dtype("<i8")}
#: Stands for the arm's id in a header serialised once for many arms.
_ARM_MARK = "\0arm\0"
_INITIAL_CAPACITY = 8
#: up to this many values, rows are checked for NaN and inf in C (numpy is faster on more)
_FEW_VALUES = 1 << 12


class Prior(NamedTuple):
    """Prior of one arm: the mean reward it starts at and its weight in pseudo-observations."""

    mean: float
    strength: float


class Choice(NamedTuple):
    """One decision: the full distribution over the candidates, the index drawn from it and its
    probability (``probabilities[chosen]``)."""

    probabilities: np.ndarray
    chosen: int
    probability: float


class Block(NamedTuple):
    """Where the candidates' arms sit in the stacked per-arm arrays, when they fill a block.

    The candidates' slots are a permutation of ``start, ..., start + K - 1``: per-arm arrays can
    be sliced (a view) instead of gathered (a copy). ``perm[k]`` is candidate k's position in the
    block and ``inv`` its inverse (block position -> candidate), both None when the candidates
    come in block order.
    """

    start: int
    perm: np.ndarray | None
    inv: np.ndarray | None


class Drift(NamedTuple):
    """Drift statistics of one arm for guards and operators: trace of the posterior covariance,
    ``||A||_2``, and how many times a change detector has flagged the arm (0 without one)."""

    cov_trace: float
    spectral_norm: float
    alarms: int = 0


def canonical_arm(arm: Any) -> str:
    """The string id of an arm; an int (or numpy integer) becomes its decimal string."""
    if isinstance(arm, str):
        return str(arm)
    if isinstance(arm, (int, np.integer)) and not isinstance(arm, (bool, np.bool_)):
        return str(int(arm))
    raise TypeError(f"arm ids must be str (or int), got {type(arm).__name__}: {arm!r}")


def valid_dim(dim: Any) -> int:
    """``dim`` as an int, or a ValueError saying what was expected."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or dim < 1:
        raise ValueError(f"dim must be a positive int, got {dim!r}")
    return int(dim)


@functools.cache
def _param_names(cls: type) -> tuple[str, ...]:
    names: list[str] = []
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for p in inspect.signature(init).parameters.values():
            if p.name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.name not in names:
                names.append(p.name)
    return tuple(names)


class Policy:
    """Base of every policy; see the module docstring for the mechanics it owns.

    Parameters common to every policy:

    - ``dim``: length of the feature rows X (the FeatureConfig's dimension; intercept at 0).
    - ``eps0``: exploration floor in [0, 1]; every candidate gets probability >= eps0 / K.
    - ``gamma``: forgetting factor in (0, 1] per row the arm learns; 1 never forgets.
    - ``half_life_s``: forgetting by event time, the seconds after which evidence weighs half
      (None never forgets by time); ``update_batch`` then needs the rows' ``times``.
    - ``prior_mean``, ``prior_strength``: the prior every arm starts at.
    - ``arm_priors``: ``{arm: (mean, strength)}`` overriding the prior per arm.
    - ``seed``: seeds the policy's own generator, used when ``probabilities`` gets no rng.

    Not thread-safe for learning; concurrent ``probabilities`` calls are safe once the
    candidates' arms exist (registering a new arm takes a lock).
    """

    #: Registry name (``POLICIES`` key) and the ``policy`` field of the state header.
    name: ClassVar[str] = ""
    #: One model over action-dependent rows (state under :data:`SHARED_ARM`), not one per arm.
    shared: ClassVar[bool] = False
    #: Per-arm sufficient statistics, in serialisation order.
    _stat_names: ClassVar[tuple[str, ...]] = ()
    #: Statistics that are symmetric d x d matrices, stored as their upper triangle.
    _packed: ClassVar[frozenset[str]] = frozenset()
    #: Names of the scoring view's per-arm arrays.
    _scoring_names: ClassVar[tuple[str, ...]] = ()

    def __init__(
        self,
        dim: int,
        *,
        eps0: float = 0.05,
        gamma: float = 1.0,
        half_life_s: float | None = None,
        prior_mean: float = 0.0,
        prior_strength: float = 1.0,
        arm_priors: Mapping[str, Any] | None = None,
        seed: int | None = None,
    ) -> None:
        dim = valid_dim(dim)
        if not 0.0 <= eps0 <= 1.0:
            raise ValueError(f"eps0 must be in [0, 1], got {eps0!r}")
        if not 0.0 < gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")
        if half_life_s is not None and not (
            isinstance(half_life_s, (int, float)) and not isinstance(half_life_s, bool) and 0.0 < half_life_s < math.inf
        ):
            raise ValueError(f"half_life_s must be a positive number of seconds or None, got {half_life_s!r}")
        self.dim = int(dim)
        self.eps0 = float(eps0)
        self.gamma = float(gamma)
        self.half_life_s = None if half_life_s is None else float(half_life_s)
        self.prior_mean = float(prior_mean)
        self.prior_strength = float(prior_strength)
        self._check_prior(self.prior_mean, self.prior_strength, "the default prior")
        self.arm_priors: dict[str, Prior] = {}
        for arm, value in (arm_priors or {}).items():
            prior = Prior(**value) if isinstance(value, Mapping) else Prior(*value)
            prior = Prior(float(prior.mean), float(prior.strength))
            self._check_prior(prior.mean, prior.strength, f"arm {arm!r}'s prior")
            self.arm_priors[canonical_arm(arm)] = prior
        self.seed = None if seed is None else int(seed)
        self._rng = np.random.default_rng(self.seed)
        self._scoring_only = False
        self._slot: dict[Any, int] = {}
        self._arms: list[str] = []
        self._arrays: dict[str, np.ndarray] = {}
        self._capacity = 0
        self._lock = threading.Lock()
        self._candidates: tuple[tuple, np.ndarray, Block | None] | None = None
        self._grow(_INITIAL_CAPACITY)
        if self.shared:
            self._register(SHARED_ARM)

    # --- hooks a policy module implements --------------------------------------------------------

    def _check_prior(self, mean: float, strength: float, what: str) -> None:
        if not (math.isfinite(mean) and math.isfinite(strength) and strength >= 0.0):
            raise ValueError(f"{what} needs a finite mean and a strength >= 0, got ({mean}, {strength})")

    def _stat_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each per-arm statistic (without the arm axis)."""
        raise NotImplementedError

    def _prior_stats(self, mean: np.ndarray, strength: np.ndarray) -> dict[str, np.ndarray]:
        """Each statistic's prior value for arms with these prior means and strengths (g,)."""
        raise NotImplementedError

    def _accumulate(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, X: np.ndarray, r: np.ndarray, w: np.ndarray
    ) -> None:
        """Add ``sum_i w_i f(x_i, r_i)`` to each arm's statistics.

        Rows are sorted by arm: arm ``slots[j]`` owns rows ``starts[j] : starts[j] + counts[j]``;
        ``w`` already carries the forgetting discount.
        """
        raise NotImplementedError

    def _policy_probabilities(
        self, X: np.ndarray, slots: np.ndarray, block: Block | None, rng: np.random.Generator
    ) -> np.ndarray:
        """The policy's own distribution over the K candidates (before the floor), a fresh array.

        ``slots`` are the candidates' arm slots; ``block`` says whether they fill a contiguous
        block of the per-arm arrays (see :class:`Block`), else None.
        """
        raise NotImplementedError

    def _compiled_choice(self, X: np.ndarray, slots: np.ndarray, rng: np.random.Generator) -> Choice | None:
        """All of :meth:`probabilities` after the candidates' slots in one compiled call
        (``learner._fastscore``), or None: the numpy path runs. The compiled call must give the
        numpy path's distribution and choice from the same draws of ``rng``."""
        return None

    def _drift(self, slot: int) -> Drift:
        raise NotImplementedError

    def _alarms(self, slot: int) -> int:
        """Times a change detector has flagged the arm in this slot (0 without one)."""
        return 0

    def _scoring_shapes(self) -> dict[str, tuple[int, ...]]:
        """Shape of each per-arm scoring array; defaults to the statistics themselves."""
        return self._stat_shapes()

    def _scoring_stack(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The scoring view of these arms, stacked (g, ...)."""
        return {name: self._arrays[name][slots].copy() for name in self._stat_names}

    def _load_scoring_stack(self, slots: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        for name in self._stat_names:
            self._arrays[name][slots] = arrays[name]

    def _cache_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Derived per-arm arrays (not serialised), e.g. factorisations."""
        return {}

    def _detector_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-arm state of a change detector: serialised in both views, all or none (a blob
        written without them loads with the detector fresh, at zeros), never a statistic."""
        return {}

    def _clock_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """The per-arm event-time clock of a policy that forgets by time (``half_life_s``):
        serialised in both views, all or none (absent: the arms' clocks start at :data:`NEVER`)."""
        return {"clock": ((), np.dtype(np.int64))} if self.half_life_s is not None else {}

    def _robust_specs(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """Per-arm state of robust learning (``learner/policies/_robust.py``): serialised in the
        full view, all or none (absent: the arms' scales start over, at zeros); a scoring view
        leaves it out, and loads it where a scoring blob still holds it."""
        return {}

    def _restart_scales(self, slots: np.ndarray) -> None:
        """These arms went back to their prior: robust learning's scales start over."""

    def _batch_means(self, slots: np.ndarray) -> np.ndarray | None:
        """The arms' posterior means as a batch finds them, when more than the detector needs
        them (one stacked solve shared by both); None otherwise."""
        return None

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
        """Run the change detector over a batch before it is learned (rows sorted by arm as in
        :meth:`_accumulate`, ``w`` the raw weights, ``theta`` every arm's :meth:`_batch_means`
        or None); the factor ``keep`` in [0, 1] each arm's statistics are discounted by toward
        their prior, ``S <- S0 + keep * (S - S0)``, before the batch is added (1: not
        flagged), or None when no arm is flagged."""
        return None

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
        """The rows' weights for learning after robust reweighting (``_robust.py``); ``w`` as it is here."""
        return w

    def _reset_cache(self, slots: np.ndarray) -> None:
        """New arms are at their prior: set their derived arrays accordingly."""

    def _invalidate(self, slots: np.ndarray, counts: np.ndarray) -> None:
        """These arms' statistics changed by ``counts`` rows (or were loaded, counts = -1)."""

    def _settle(self) -> None:
        """Finish any update of the statistics left for later: called before they are read."""

    def _carried_shapes(self) -> dict[str, tuple[int, ...]]:
        """Derived arrays that the full view carries when they are state: computed in a way
        that a reload could not repeat bit for bit (the shared model's in-place factor)."""
        return {}

    def _carried_arrays(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """Those of :meth:`_carried_shapes` these arms hold as state now (all or none)."""
        return {}

    def _load_carried(self, slots: np.ndarray, arrays: Mapping[str, np.ndarray]) -> None:
        """Take the carried arrays of freshly loaded statistics (raise StateFormatError)."""

    def _cache_of(self, slots: np.ndarray) -> Any:
        """A copy of these arms' derived arrays, for :meth:`_restore_cache` after a refused load."""
        return None

    def _restore_cache(self, slots: np.ndarray, cache: Any) -> None:
        """Put back what :meth:`_cache_of` returned, where it is state."""

    @classmethod
    def _unit_test_params(cls) -> dict[str, Any]:
        """Parameters for the generic test suite (small dim, a visible floor)."""
        return {"dim": 4, "eps0": 0.1, "seed": 0}

    # --- parameters ------------------------------------------------------------------------------

    def get_params(self) -> dict[str, Any]:
        """Constructor parameters as plain JSON-able data: ``type(p)(**p.get_params())`` clones."""
        params: dict[str, Any] = {}
        for name in _param_names(type(self)):
            value = getattr(self, name)
            if name == "arm_priors":
                value = {arm: [prior.mean, prior.strength] for arm, prior in value.items()}
            elif isinstance(value, tuple):
                value = list(value)
            params[name] = value
        return params

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({params})"

    # --- arms ------------------------------------------------------------------------------------

    def arm_ids(self) -> list[str]:
        """Ids of every arm this policy holds state for, in the order they entered."""
        return list(self._arms)

    def add_arm(self, arm: Any) -> None:
        """Hold state for ``arm`` from now on, at its prior (no-op for an arm already held)."""
        if self._scoring_only:
            raise ScoringOnlyError(f"{type(self).__name__} built from a scoring view holds no statistics")
        self._slot_of(arm)

    def prior_of(self, arm: Any) -> Prior:
        return self.arm_priors.get(canonical_arm(arm), Prior(self.prior_mean, self.prior_strength))

    def arm_statistics(self, arm: Any) -> dict[str, np.ndarray]:
        """A copy of one arm's sufficient statistics (e.g. ``A`` and ``b``), for audit and tests."""
        if self._scoring_only:
            raise ScoringOnlyError(f"{type(self).__name__} built from a scoring view holds no statistics")
        slot = self._existing_slot(arm)
        self._settle()
        return {name: self._arrays[name][slot].copy() for name in self._stat_names}

    def expected_rewards(self, X: np.ndarray, arms: Sequence[Any]) -> np.ndarray:
        """The model's mean reward of each row with its own arm (row ``i`` scored for
        ``arms[i]``; a shared model ignores the ids): ``x . theta`` for the linear models, the
        arm's mean for the count-based ones; NaN for an arm the policy holds no state for.
        For statistics (``banditstream stats``), not for deciding: no exploration, no floor."""
        X = self._check_rows(X, "X")
        if len(arms) != X.shape[0]:
            raise ValueError(f"arms has {len(arms)} ids, but X has {X.shape[0]} rows")
        out = np.full(X.shape[0], np.nan)
        if not self._arms:
            return out
        if self.shared:
            slots = np.zeros(X.shape[0], dtype=np.intp)
        else:
            lookup = self._slot
            slots = np.fromiter(  # the canonical form only for an id not held as given
                (s if (s := lookup.get(a)) is not None else lookup.get(canonical_arm(a), -1) for a in arms),
                dtype=np.intp, count=len(arms),
            )  # fmt: skip
        known = slots >= 0
        if known.any():
            out[known] = self._row_means(X[known], slots[known])
        return out

    def _row_means(self, X: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Mean rewards of rows ``X`` with the arms in ``slots`` (one per row, repeats allowed)."""
        raise NotImplementedError

    def update_count(self, arm: Any) -> int:
        """Number of rows folded into this arm's state (forgetting does not lower it)."""
        return int(self._arrays["count"][self._existing_slot(arm)])

    def _existing_slot(self, arm: Any) -> int:
        slot = self._slot.get(arm)
        if slot is None:
            slot = self._slot.get(canonical_arm(arm))
            if slot is None:
                raise KeyError(f"{type(self).__name__} holds no state for arm {arm!r}")
        return slot

    def _slot_of(self, arm: Any) -> int:
        slot = self._slot.get(arm)
        return self._resolve(arm) if slot is None else slot

    def _resolve(self, arm: Any) -> int:
        """Slot of an arm not found under this key: canonicalise, register if new, alias."""
        canon = canonical_arm(arm)
        with self._lock:
            slot = self._slot.get(canon)
            if slot is None:
                slot = self._register(canon)
            if not (type(arm) is str and arm == canon):
                self._slot[int(arm) if not isinstance(arm, str) else arm] = slot
        return slot

    def _register(self, arm: str) -> int:
        if len(self._arms) == self._capacity:
            self._grow(2 * self._capacity)
        slot = len(self._arms)
        prior = self.arm_priors.get(arm, Prior(self.prior_mean, self.prior_strength))
        self._arrays["pmean"][slot] = prior.mean
        self._arrays["pstrength"][slot] = prior.strength
        self._arrays["count"][slot] = 0
        slots = np.array([slot])
        for name, value in self._prior_stats(self._arrays["pmean"][slots], self._arrays["pstrength"][slots]).items():
            self._arrays[name][slots] = value
        self._reset_cache(slots)
        for name in self._detector_specs():
            self._arrays[name][slots] = 0
        for name in self._clock_specs():
            self._arrays[name][slots] = NEVER
        for name in self._robust_specs():
            self._arrays[name][slots] = 0
        self._arms.append(arm)
        self._slot[arm] = slot  # published last: readers without the lock see a complete arm
        return slot

    def _grow(self, capacity: int) -> None:
        specs: dict[str, tuple[tuple[int, ...], np.dtype]] = {
            "count": ((), np.dtype(np.int64)),
            "pmean": ((), np.dtype(np.float64)),
            "pstrength": ((), np.dtype(np.float64)),
        }
        specs.update({name: (shape, np.dtype(np.float64)) for name, shape in self._stat_shapes().items()})
        specs.update(self._cache_specs())
        specs.update(self._detector_specs())
        specs.update(self._clock_specs())
        specs.update(self._robust_specs())
        n = len(self._arms)
        arrays = {}
        for name, (shape, dtype) in specs.items():
            new = np.zeros((capacity, *shape), dtype=dtype)
            if name in self._arrays:
                new[:n] = self._arrays[name][:n]
            arrays[name] = new
        self._arrays = arrays  # swapped in one assignment
        self._capacity = capacity

    # --- learning --------------------------------------------------------------------------------

    def update_batch(
        self,
        X: np.ndarray,
        arms: Sequence[Any],
        rewards: Sequence[float] | np.ndarray,
        weights: Sequence[float] | np.ndarray | None = None,
        times: Sequence[int] | np.ndarray | None = None,
    ) -> list[str]:
        """Fold n labelled rows into the arms' statistics; returns the touched arm ids.

        ``X`` (n, dim): the acted action's feature row; ``arms``: the n acted arm ids;
        ``rewards`` (n,); ``weights`` (n,) non-negative, default 1; ``times`` (n,) the rows'
        event times in epoch milliseconds (the decisions' timestamps), which a policy that
        forgets by time (``half_life_s``) needs and any other ignores. Equal to n sequential
        one-row updates in the given order (see the module docstring for forgetting).
        """
        if self._scoring_only:
            raise ScoringOnlyError(f"{type(self).__name__} built from a scoring view cannot learn")
        X = self._check_rows(X, "X")
        n = X.shape[0]
        r = np.asarray(rewards, dtype=np.float64)
        if r.shape != (n,):
            raise ValueError(f"rewards has shape {r.shape}, but X has {n} rows")
        if not np.isfinite(r).all():
            raise ValueError("rewards must be finite")
        if weights is None:
            w = np.ones(n)
        else:
            w = np.asarray(weights, dtype=np.float64)
            if w.shape != (n,):
                raise ValueError(f"weights has shape {w.shape}, but X has {n} rows")
            if not (np.isfinite(w).all() and (w >= 0).all()):
                raise ValueError("weights must be finite and >= 0")
        if len(arms) != n:
            raise ValueError(f"arms has {len(arms)} ids, but X has {n} rows")
        t = self._check_times(times, n)
        if n == 0:
            return []

        if self.shared:
            slots = np.zeros(1, dtype=np.intp)
            starts = np.zeros(1, dtype=np.intp)
            counts = np.array([n], dtype=np.intp)
            rank_from_end = np.arange(n - 1, -1, -1) if self.gamma < 1.0 else None
        else:
            seq = arms.tolist() if isinstance(arms, np.ndarray) else arms
            get = self._slot.get
            raw = [get(a) for a in seq]
            if None in raw:
                raw = [self._slot_of(a) if s is None else s for a, s in zip(seq, raw)]
            row_slots = np.array(raw, dtype=np.intp)
            order = np.argsort(row_slots, kind="stable")
            sorted_slots = row_slots[order]
            slots, starts, counts = np.unique(sorted_slots, return_index=True, return_counts=True)
            if len(slots) > 1:
                X, r, w = X[order], r[order], w[order]
                t = None if t is None else t[order]
            if self.gamma < 1.0:
                ends = np.repeat(starts + counts, counts)
                rank_from_end = ends - 1 - np.arange(n)
            else:
                rank_from_end = None

        theta = self._batch_means(slots)
        keep = self._detect(slots, starts, counts, X, r, w, theta)  # on the model as the batch finds it
        w = self._robust(slots, starts, counts, X, r, w, keep, theta)
        decay = None
        if rank_from_end is not None:
            w = w * self.gamma ** rank_from_end
            decay = self.gamma ** counts.astype(np.float64)
        if t is not None:
            w, aged = self._age_rows(slots, starts, counts, t, w)
            decay = aged if decay is None else decay * aged
        if keep is not None:
            decay = keep if decay is None else decay * keep
        if decay is not None:
            discounted = decay < 1.0
            self._forget(slots[discounted], decay[discounted])
        self._accumulate(slots, starts, counts, np.asarray(X), r, w)
        self._arrays["count"][slots] += counts
        self._invalidate(slots, counts)
        return [self._arms[s] for s in slots.tolist()]

    def _check_times(self, times: Any, n: int) -> np.ndarray | None:
        """The rows' event times as int64 milliseconds when this policy forgets by time (None
        otherwise); a ValueError saying what was expected."""
        if self.half_life_s is None:
            return None
        if times is None:
            raise ValueError(f"{type(self).__name__} forgets by event time (half_life_s={self.half_life_s:g}): "
                             "update_batch needs the rows' times (epoch milliseconds)")  # fmt: skip
        t = np.asarray(times)
        if t.shape != (n,):
            raise ValueError(f"times has shape {t.shape}, but X has {n} rows")
        if n and t.dtype.kind not in "iu":
            if t.dtype.kind != "f" or not np.isfinite(t).all() or (t != np.round(t)).any():
                raise ValueError("times must be whole epoch milliseconds")
        return t.astype(np.int64)

    def _decay_over(self, elapsed_ms: np.ndarray) -> np.ndarray:
        """``2^(-elapsed / half-life)``: what evidence keeps after ``elapsed_ms`` of event time."""
        return np.exp2(elapsed_ms.astype(np.float64) / (-1000.0 * self.half_life_s))

    def _age_rows(
        self, slots: np.ndarray, starts: np.ndarray, counts: np.ndarray, t: np.ndarray, w: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """Forgetting by time over a batch (rows grouped by arm): each arm is brought to
        ``T = max(clock, newest row)``, its clock set to ``T``; returns the rows' weights aged
        to ``T`` and each arm's decay of what it held before the batch (module docstring)."""
        clock = self._arrays["clock"]
        before = clock[slots]
        newest = np.maximum(np.maximum.reduceat(t, starts), before)
        before = np.where(before == NEVER, newest, before)  # an arm with no clock has nothing to age
        w = w * self._decay_over(np.repeat(newest, counts) - t)
        clock[slots] = newest
        return w, self._decay_over(newest - before)

    @property
    def clock(self) -> int | None:
        """The newest event time (epoch ms) any arm has been brought to; None when no arm has
        learned a timed row (or the policy does not forget by time)."""
        if self.half_life_s is None or not self._arms:
            return None
        newest = int(self._arrays["clock"][: len(self._arms)].max())
        return None if newest == NEVER else newest

    def _behind(self, to: int) -> np.ndarray:
        """Slots of the arms with a clock earlier than ``to`` (an arm with none has nothing to age)."""
        clock = self._arrays["clock"][: len(self._arms)]
        return np.flatnonzero((clock != NEVER) & (clock < to))

    def age(self, to_ms: int | None = None) -> list[str]:
        """Bring every arm whose clock is behind ``to_ms`` (default :attr:`clock`, the newest)
        to it, forgetting as the time between says; the arms aged. A no-op for a policy that does
        not forget by time. What a snapshot does to arms nobody played (:meth:`scoring_view`)."""
        if self.half_life_s is None:
            return []
        if self._scoring_only:
            raise ScoringOnlyError(f"{type(self).__name__} built from a scoring view cannot age")
        to = self.clock if to_ms is None else int(to_ms)
        if to is None:
            return []
        clock = self._arrays["clock"]
        slots = self._behind(to)
        if len(slots):
            self._forget(slots, self._decay_over(to - clock[slots]))
            clock[slots] = to
            self._invalidate(slots, np.full(len(slots), -1))  # changed as by a load: refactorise
        return [self._arms[s] for s in slots.tolist()]

    def _forget(self, slots: np.ndarray, decay: np.ndarray) -> None:
        self._settle()
        prior = self._prior_stats(self._arrays["pmean"][slots], self._arrays["pstrength"][slots])
        for name in self._stat_names:
            stat = self._arrays[name]
            keep = decay.reshape((-1,) + (1,) * (stat.ndim - 1))
            stat[slots] = keep * stat[slots] + (1.0 - keep) * prior[name]

    def _check_rows(self, X: Any, what: str) -> np.ndarray:
        X = np.asarray(X, dtype=np.float64)
        if X.ndim != 2 or X.shape[1] != self.dim:
            raise ValueError(f"{what} has shape {X.shape}, but {type(self).__name__} expects (n, {self.dim})")
        if not _all_finite(X):
            raise ValueError(f"{what} must be finite (NaN or inf found)")
        return X

    # --- deciding --------------------------------------------------------------------------------

    def probabilities(
        self,
        X: np.ndarray,
        arms: Sequence[Any],
        rng: np.random.Generator | int | None = None,
    ) -> Choice:
        """Distribution over the K candidates, floor mixed in, and one choice drawn from it.

        ``X`` (K, dim): candidate rows (for per-arm models each row is the context vector);
        ``arms``: the K candidate ids (new ones enter at their prior); ``rng``: a numpy
        Generator, a seed, or None for the policy's own generator.
        """
        X = self._check_rows(X, "X")
        K = X.shape[0]
        if K == 0:
            raise ValueError("probabilities needs at least one candidate")
        if len(arms) != K:
            raise ValueError(f"arms has {len(arms)} ids, but X has {K} rows")
        gen = self._generator(rng)
        slots, block = self._candidate_slots(arms)
        compiled = self._compiled_choice(X, slots, gen)
        if compiled is not None:
            return compiled
        p = self._policy_probabilities(X, slots, block, gen)
        if self.eps0 > 0.0:
            p *= 1.0 - self.eps0
            p += self.eps0 / K
        chosen = draw_index(p, gen.random())
        return Choice(p, chosen, float(p[chosen]))

    def _generator(self, rng: np.random.Generator | int | None) -> np.random.Generator:
        """``rng`` as a Generator: the policy's own for None, a new seeded one for an int."""
        if rng is None:
            return self._rng
        return rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)

    def _candidate_slots(self, arms: Sequence[Any]) -> tuple[np.ndarray, Block | None]:
        key = arms if isinstance(arms, tuple) else tuple(arms.tolist() if isinstance(arms, np.ndarray) else arms)
        cached = self._candidates
        if cached is not None and cached[0] == key:
            return cached[1], cached[2]
        K = len(key)
        block = None
        if self.shared:
            slots = np.zeros(K, dtype=np.intp)
        else:
            slots = np.fromiter((self._slot_of(a) for a in key), dtype=np.intp, count=K)
            if len(set(slots.tolist())) != K:
                raise ValueError(f"candidate ids must be distinct, got {list(key)!r}")
            start = int(slots.min())
            if int(slots.max()) - start == K - 1:  # distinct and spanning K slots: a block
                perm = slots - start
                if (perm == np.arange(K)).all():
                    block = Block(start, None, None)
                else:
                    block = Block(start, perm, np.argsort(perm))
        self._candidates = (key, slots, block)  # one assignment: atomic for readers
        return slots, block

    # --- guards and scoring view -----------------------------------------------------------------

    def alarms(self, arm: Any) -> int:
        """Times a change detector has flagged one arm (0 without a detector); cheap, unlike
        :meth:`drift`."""
        return self._alarms(self._existing_slot(arm))

    def drift(self, arm: Any) -> Drift:
        """(trace of the posterior covariance, spectral norm of A, detector alarms) of one arm."""
        slot = self._existing_slot(arm)
        return self._drift(slot)._replace(alarms=self._alarms(slot))

    def scoring_arrays(self, arm: Any) -> dict[str, np.ndarray]:
        """What deciding needs of one arm, as plain arrays (e.g. ``theta`` and ``L``)."""
        slot = self._existing_slot(arm)
        stack = self._scoring_stack(np.array([slot]))
        return {name: value[0] for name, value in stack.items()}

    @classmethod
    def from_scoring(cls, params: Mapping[str, Any], arms: Mapping[str, Mapping[str, np.ndarray]]) -> Policy:
        """A scoring-only policy from ``params`` and ``{arm: scoring_arrays(arm)}``."""
        policy = cls(**params)
        policy._scoring_only = True
        ids = list(arms)
        slots = np.array([policy._slot_of(a) for a in ids], dtype=np.intp)
        if ids:
            stacked = {
                name: np.stack([np.asarray(arms[a][name], dtype=np.float64) for a in ids]) for name in cls._scoring_names
            }
            for name, (_, dtype) in {**policy._detector_specs(), **policy._clock_specs(), **policy._robust_specs()}.items():
                if all(name in arms[a] for a in ids):
                    stacked[name] = np.stack([np.asarray(arms[a][name], dtype=dtype) for a in ids])
            count = np.array([int(np.asarray(arms[a].get("count", 0))) for a in ids], dtype=np.int64)
            policy._load_view(slots, stacked, "scoring", count=count)
        return policy

    def scoring_view(self) -> Policy:
        """A scoring-only copy holding every arm's scoring arrays (what a snapshot carries).

        A policy that forgets by time scores every arm as of its newest clock: arms behind it
        are aged in a copy (:meth:`age`), this policy's own state is left as it is."""
        if self.half_life_s is not None and not self._scoring_only:
            newest = self.clock
            if newest is not None and len(self._behind(newest)):
                aged = type(self).from_bytes(self.to_bytes())
                aged.age(newest)
                return aged.scoring_view()
        slots = np.arange(len(self._arms))
        view = type(self)(**self.get_params())
        view._scoring_only = True
        for arm in self._arms:
            view._slot_of(arm)
        arrays = {**self._scoring_stack(slots), **self._side_arrays(slots, "scoring")}
        view._load_view(slots, arrays, "scoring", count=self._arrays["count"][slots])
        return view

    @property
    def scoring_only(self) -> bool:
        return self._scoring_only

    # --- bytes -----------------------------------------------------------------------------------

    def _view(self) -> str:
        return "scoring" if self._scoring_only else "full"

    def _view_shapes(self, view: str) -> dict[str, tuple[int, ...]]:
        if view == "full":
            shapes = {
                name: (packed_size(self.dim),) if name in self._packed else shape
                for name, shape in self._stat_shapes().items()
            }
        else:
            shapes = dict(self._scoring_shapes())
        shapes["count"] = ()
        return shapes

    def _view_arrays(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        if self._scoring_only:
            arrays = self._scoring_stack(slots)
        else:
            self._settle()
            arrays = {}
            for name in self._stat_names:
                value = self._arrays[name][slots]
                arrays[name] = pack_symmetric(value) if name in self._packed else value
            arrays.update(self._carried_arrays(slots))
        arrays["count"] = self._arrays["count"][slots]
        arrays.update(self._side_arrays(slots, self._view()))
        return arrays

    def _side_arrays(self, slots: np.ndarray, view: str) -> dict[str, np.ndarray]:
        """The arrays a view carries beside the statistics: a detector's and the clock in both,
        robust learning's scales in the full view only. Deciding never reads them, and an SDK
        from before robust learning refuses a scoring blob that holds arrays it does not know."""
        robust = self._robust_specs() if view == "full" else {}
        return {name: self._arrays[name][slots] for name in (*self._detector_specs(), *self._clock_specs(), *robust)}

    def _load_view(self, slots: np.ndarray, arrays: Mapping[str, np.ndarray], view: str, count: np.ndarray | None) -> None:
        """Check shapes and values of stacked arrays for ``slots`` against ``view`` and load them."""
        shapes = self._view_shapes(view)
        g = len(slots)
        if count is not None:
            arrays = {**arrays, "count": np.asarray(count)}
        optional = self._carried_shapes() if view == "full" else {}
        carried = set(arrays) & set(optional)
        detector = {name: shape for name, (shape, _) in self._detector_specs().items()}
        detected = set(arrays) & set(detector)  # none: a blob from before the detector, which starts fresh
        clock = {name: shape for name, (shape, _) in self._clock_specs().items()}
        clocked = set(arrays) & set(clock)  # none: a blob written before the policy forgot by time
        robust = {name: shape for name, (shape, _) in self._robust_specs().items()}
        scaled = set(arrays) & set(robust)  # none: a blob written before robust learning, whose scales start over
        groups = ((optional, carried), (detector, detected), (clock, clocked), (robust, scaled))
        if set(arrays) - carried - detected - clocked - scaled != set(shapes) or any(
            held not in (set(), set(group)) for group, held in groups
        ):
            also = "".join(f" (and all or none of {sorted(group)})" for group, _ in groups if group)
            raise StateFormatError(
                f"{self.name} {view} state needs arrays {sorted(shapes)}{also}, the blob has {sorted(arrays)}"
            )
        shapes = {**shapes, **{name: group[name] for group, held in groups for name in held}}
        for name, shape in shapes.items():
            value = arrays[name]
            if value.shape != (g, *shape):
                raise StateFormatError(f"array {name!r} has shape {value.shape[1:]}, {self.name} at dim={self.dim} needs {shape}")
            if value.dtype.kind == "f" and not np.isfinite(value).all():
                raise StateFormatError(f"array {name!r} holds NaN or inf")
        if (np.asarray(arrays["count"]) < 0).any():
            raise StateFormatError("negative update count")
        counted = {**self._detector_specs(), **self._robust_specs()}  # their integer arrays count rows and alarms
        for name in (*detected, *scaled):
            if counted[name][1].kind == "i" and (np.asarray(arrays[name]) < 0).any():
                raise StateFormatError(f"array {name!r} holds a negative count")
        if "robust_scale" in scaled and (np.asarray(arrays["robust_scale"]) < 0).any():
            raise StateFormatError("array 'robust_scale' holds a negative scale")
        self._settle()  # into the statistics being replaced: kept if the blob is refused
        previous = {"count": self._arrays["count"][slots]}
        self._arrays["count"][slots] = arrays["count"]
        for name in detector:
            previous[name] = self._arrays[name][slots]
            self._arrays[name][slots] = arrays[name] if detected else 0
        for name in clock:
            previous[name] = self._arrays[name][slots]
            self._arrays[name][slots] = arrays[name] if clocked else NEVER
        for name in robust:
            previous[name] = self._arrays[name][slots]
            self._arrays[name][slots] = arrays[name] if scaled else 0
        if view == "full":
            previous.update((name, self._arrays[name][slots]) for name in self._stat_names)
            cache = self._cache_of(slots)
            for name in self._stat_names:
                value = arrays[name]
                self._arrays[name][slots] = unpack_symmetric(value, self.dim) if name in self._packed else value
            self._invalidate(slots, np.full(g, -1))
            try:
                self._check_loaded(slots)
                if carried:
                    self._load_carried(slots, arrays)
            except StateFormatError:
                for name, value in previous.items():  # refuse the blob, keep what we had
                    self._arrays[name][slots] = value
                self._invalidate(slots, np.full(g, -1))
                self._restore_cache(slots, cache)
                raise
        else:
            self._load_scoring_stack(slots, arrays)

    def _check_loaded(self, slots: np.ndarray) -> None:
        """Policy-specific sanity checks of freshly loaded statistics (raise StateFormatError)."""

    def to_bytes(self) -> bytes:
        """The whole policy: parameters, arm ids and every arm's state (or scoring view)."""
        slots = np.arange(len(self._arms))
        header = {
            "policy": self.name,
            "kind": "policy",
            "view": self._view(),
            "dim": self.dim,
            "params": self.get_params(),
            "arms": list(self._arms),
        }
        return _encode(header, self._view_arrays(slots))

    @classmethod
    def from_bytes(cls, data: bytes) -> Policy:
        """Rebuild a policy from :meth:`to_bytes`. On ``Policy`` itself any registered policy loads.

        The generator restarts from ``seed``; derived factorisations are rebuilt lazily.
        """
        header, arrays = _decode(data)
        if header.get("kind") != "policy":
            raise StateFormatError(f"expected a whole-policy state, got kind {header.get('kind')!r}")
        return cls._resolve_class(header.get("policy"))._from_decoded(header, arrays)

    @classmethod
    def _from_decoded(cls, header: dict[str, Any], arrays: dict[str, np.ndarray]) -> Policy:
        """The policy of a decoded whole-policy blob, ``cls`` being the class that wrote it."""
        klass = cls
        params = header.get("params")
        arms = header.get("arms")
        if not isinstance(params, dict) or not isinstance(arms, list) or not all(isinstance(a, str) for a in arms):
            raise StateFormatError("policy header lacks params or arms")
        try:
            policy = klass(**params)
        except (TypeError, ValueError) as exc:
            raise StateFormatError(f"parameters in the header do not build {klass.__name__}: {exc}") from exc
        if header.get("dim") != policy.dim:
            raise StateFormatError(f"header dim {header.get('dim')!r} disagrees with params dim {policy.dim}")
        view = header.get("view")
        if view not in ("full", "scoring"):
            raise StateFormatError(f"unknown view {view!r}")
        policy._scoring_only = view == "scoring"
        slots = np.array([policy._slot_of(a) for a in arms], dtype=np.intp)
        if len(set(slots.tolist())) != len(arms):
            raise StateFormatError("duplicate arm ids in the header")
        policy._load_view(slots, arrays, view, count=None)
        return policy

    @classmethod
    def _resolve_class(cls, name: Any) -> type[Policy]:
        if cls.name:
            if name != cls.name:
                raise StateFormatError(f"state was written by policy {name!r}, not {cls.name!r}")
            return cls
        from learner.policies import POLICIES  # the registry lives in the package, which imports us

        if name not in POLICIES:
            raise StateFormatError(f"state was written by unknown policy {name!r}")
        return POLICIES[name]

    def arm_state_bytes(self, arm: Any) -> bytes:
        """One arm's state as its own blob: a store keeps one value per (domain, arm)."""
        return self.arm_states_bytes([arm])[0]

    def arm_states_bytes(self, arms: Sequence[Any]) -> list[bytes]:
        """:meth:`arm_state_bytes` of each of ``arms``, in order: the same bytes, read from the
        arrays in one pass (the learner writes every arm a block touched, each block)."""
        slots = np.array([self._existing_slot(arm) for arm in arms], dtype=np.intp)
        header = {"policy": self.name, "kind": "arm", "view": self._view(), "dim": self.dim}
        return _encode_arms(header, [self._arms[slot] for slot in slots.tolist()], self._view_arrays(slots))

    def _check_arm_header(self, header: Mapping[str, Any], arm: Any) -> str:
        """The arm's canonical id, once the header says the blob is one arm's state of this
        policy, dimension and view, and of this arm (else :class:`StateFormatError`)."""
        canon = canonical_arm(arm)
        if header.get("kind") != "arm":
            raise StateFormatError(f"expected one arm's state, got kind {header.get('kind')!r}")
        if header.get("policy") != self.name:
            raise StateFormatError(f"state was written by policy {header.get('policy')!r}, not {self.name!r}")
        if header.get("dim") != self.dim:
            raise StateFormatError(f"state has dim {header.get('dim')!r}, this policy has dim {self.dim}")
        if header.get("view") != self._view():
            raise StateFormatError(f"state is a {header.get('view')!r} view, this policy holds a {self._view()!r} view")
        if header.get("arm") != canon:
            raise StateFormatError(f"state belongs to arm {header.get('arm')!r}, not {canon!r}")
        return canon

    def load_arm_state(self, arm: Any, data: bytes) -> None:
        """Replace (or create) one arm's state from :meth:`arm_state_bytes` of the same arm."""
        header, arrays = _decode(data)
        self._check_arm_header(header, arm)
        slot = self._slot_of(arm)
        stacked = {name: value[None, ...] for name, value in arrays.items()}
        self._load_view(np.array([slot]), stacked, self._view(), count=None)


# --- shared decision rules -------------------------------------------------------------------------


def _all_finite(X: np.ndarray) -> bool:
    if _fastscore is not None and X.size <= _FEW_VALUES and X.flags.c_contiguous:
        return _fastscore.all_finite(X)  # a few decision rows: numpy's fixed cost is most of it
    return bool(np.isfinite(X).all())


def draw_index(p: np.ndarray, u: float) -> int:
    """The index an inverse-CDF draw with uniform ``u`` in [0, 1) picks from distribution ``p``.

    Never picks an index of probability 0 (the running sum must strictly exceed ``u * total``).
    """
    if len(p) > 64:
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
        return i if i < len(p) else int(np.flatnonzero(p)[-1])
    values = p.tolist()  # a short Python loop beats cumsum + searchsorted for a handful of arms
    target = u * math.fsum(values)
    acc = 0.0
    last = 0
    for i, pi in enumerate(values):
        if pi > 0.0:
            acc += pi
            last = i
            if target < acc:
                return i
    return last


def greedy_distribution(scores: np.ndarray) -> np.ndarray:
    """Argmax as a distribution: the best score's candidates share probability 1 evenly."""
    best = scores == scores.max()
    return best / np.count_nonzero(best)


def argmax_frequencies(draws: np.ndarray) -> np.ndarray:
    """Share of the rows of ``draws`` (n_draws, K) in which each column is the largest."""
    n, K = draws.shape
    return np.bincount(draws.argmax(axis=1), minlength=K) / n


def gaussian_argmax_frequencies(
    mean: np.ndarray, perturb: Any, n_draws: int, rng: np.random.Generator, width: int
) -> np.ndarray:
    """Thompson frequencies for scores ``mean + perturb(z)``, z standard normal (rows of ``width``).

    ``perturb`` maps a (m, width) block of standard normals to (m, K) zero-mean score noise and
    must be linear (so ``perturb(-z) = -perturb(z)``): draws come in antithetic pairs, ``z`` and
    ``-z``, each a draw from the posterior, which halves the normals needed and the variance of
    the estimate of a symmetric posterior.
    """
    half = (n_draws + 1) // 2
    noise = perturb(rng.standard_normal((half, width)))
    K = mean.shape[0]
    scores = np.empty((n_draws, K))
    scores[:half] = noise
    np.negative(noise[: n_draws - half], out=scores[half:])
    scores += mean
    return np.bincount(scores.argmax(axis=1), minlength=K) / n_draws


# --- the binary frame ------------------------------------------------------------------------------


def _column(name: str, value: Any, shape: Sequence[int]) -> tuple[list[Any], np.ndarray]:
    """An array's header entry ``[name, dtype, shape]`` and the array in that dtype, contiguous."""
    value = np.asarray(value)
    dtype = "<i8" if value.dtype.kind in "iu" else "<f8"
    return [name, dtype, list(shape)], np.ascontiguousarray(value, dtype=_DTYPES[dtype])


def _frame(head: bytes, parts: Sequence[Any]) -> bytes:
    """The blob: frame header, JSON header, padding to 8 bytes, the arrays' bytes, CRC-32."""
    pad = b"\0" * (-(_HEAD.size + len(head)) % 8)
    body = b"".join([_HEAD.pack(_MAGIC, FORMAT_MAJOR, FORMAT_MINOR, 0, len(head)), head, pad, *parts])
    return body + _CRC.pack(zlib.crc32(body))


def _header_text(header: dict[str, Any]) -> str:
    return json.dumps(header, sort_keys=True, separators=(",", ":"), allow_nan=False)


def _encode(header: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    spec, parts = zip(*(_column(name, value, np.shape(value)) for name, value in arrays.items())) if arrays else ((), ())
    return _frame(_header_text({**header, "arrays": list(spec)}).encode("utf-8"), [part.data for part in parts])


def _encode_arms(header: dict[str, Any], arms: Sequence[str], stacked: Mapping[str, np.ndarray]) -> list[bytes]:
    """``_encode({**header, "arm": arms[i]}, {name: value[i] for name, value in stacked})`` for
    each arm i, with the header serialised once (the arm's id set in per arm) and each arm's
    arrays joined straight from the stacked ones."""
    spec, columns = zip(*(_column(name, value, np.shape(value)[1:]) for name, value in stacked.items()))
    text = _header_text({**header, "arm": _ARM_MARK, "arrays": list(spec)})
    before, _, after = text.partition(json.dumps(_ARM_MARK))  # "arm" sorts before every other key
    return [
        _frame((before + json.dumps(arm) + after).encode("utf-8"), [column[i].data for column in columns])
        for i, arm in enumerate(arms)
    ]


def _decode(data: bytes) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Header and arrays of a blob; every way it can be wrong is a :class:`StateFormatError`."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise StateFormatError(f"state must be bytes, got {type(data).__name__}")
    data = bytes(data)
    if len(data) < _HEAD.size + _CRC.size:
        raise StateFormatError(f"state of {len(data)} bytes is too short to be a policy state")
    magic, major, _minor, _reserved, header_len = _HEAD.unpack_from(data)
    if magic != _MAGIC:
        raise StateFormatError(f"not a banditstream policy state (magic {magic!r}, expected {_MAGIC!r})")
    if major != FORMAT_MAJOR:
        raise StateFormatError(f"state format major version {major}, this reader reads {FORMAT_MAJOR}")
    (crc,) = _CRC.unpack_from(data, len(data) - _CRC.size)
    body = memoryview(data)[: len(data) - _CRC.size]
    if zlib.crc32(body) != crc:
        raise StateFormatError("state checksum mismatch (damaged or truncated)")
    start = _HEAD.size + header_len
    if start > len(body):
        raise StateFormatError("header length runs past the end of the state")
    try:
        header = json.loads(bytes(body[_HEAD.size : start]).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise StateFormatError(f"header is not JSON: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        raise StateFormatError("header lacks the array table")
    offset = start + (-start % 8)
    arrays: dict[str, np.ndarray] = {}
    for entry in header["arrays"]:
        try:
            name, dtype_name, shape = entry
            dtype = _DTYPES[dtype_name]
            shape = tuple(int(s) for s in shape)
        except (TypeError, ValueError, KeyError) as exc:
            raise StateFormatError(f"bad array entry {entry!r} in the header") from exc
        if any(s < 0 for s in shape) or not isinstance(name, str) or name in arrays:
            raise StateFormatError(f"bad array entry {entry!r} in the header")
        size = math.prod(shape) * dtype.itemsize
        if offset + size > len(body):
            raise StateFormatError(f"array {name!r} runs past the end of the state")
        arrays[name] = np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=offset).reshape(shape).copy()
        offset += size
    if offset != len(body):
        raise StateFormatError(f"{len(body) - offset} unexplained bytes after the arrays")
    return header, arrays
