"""Fixed-dimension feature vectors from a DecisionEvent's context and actions.

The steps, in the order :class:`FeatureEncoder` applies them:

1. **Keys.** Every feature becomes a namespaced key: context numeric ``c/n/<name>``,
   categorical ``c/c/<name>/<value>`` (value 1), dense vector ``c/v/<i>``; the same with ``a/``
   for an action's features, and ``a/id/<id>`` (value 1) for the action id itself in shared
   models. The ``/`` is the ASCII unit separator (0x1F), which names and values do not
   contain, so no feature can forge another's key.
2. **Signed hashing.** A key's 64-bit keyed BLAKE2b digest ``h`` (key: ``FeatureConfig.seed``)
   picks slot ``off + h mod m`` and sign ``-1`` if bit 63 of ``h`` is set else ``+1``, where
   ``off`` is 1 with an intercept (slot 0 holds 1.0) and ``m = dimension - off``. Colliding
   features add with independent signs, so inner products of hashed vectors are unbiased
   (Weinberger et al. 2009). Digests are cached per key; nothing depends on Python's ``hash()``,
   so vectors are identical across processes, machines and ``PYTHONHASHSEED``.
3. **Normalisation.** With ``normalize``, a numeric feature enters as its z-score
   ``clip((x - mean) / std, -clip, clip)`` under the running mean and (population) standard
   deviation a :class:`Normalizer` keeps per feature name (Welford); a feature not yet seen, or
   without spread, enters as 0. Encoding never updates the statistics: :meth:`FeatureEncoder.observe`
   does, so the worker learns them and a snapshot ships them frozen (:meth:`Normalizer.freeze`).
   Categorical indicators and dense vectors are not normalised.
4. **Rows per candidate.** Per-arm models (``shared=False``): every candidate's row is the
   context vector (the arm's own model tells them apart; action features are not used).
   Shared models (``shared=True``): row k is intercept + context + action k's features (+ its id),
   and with ``interactions`` also every product ``context feature x action k feature``, hashed
   from the pair's digests (``splitmix64(h_c * phi xor h_a)``), so one linear model can learn
   how each action's value depends on the context.

    >>> config = FeatureConfig(dimension=16, shared=True, interactions=True, normalize=False)
    >>> encoder = FeatureEncoder(config)
    >>> context = {"numeric": {"tokens": 3.0}, "categorical": {"intent": "billing"}}
    >>> actions = [{"id": "gpt"}, {"id": "small", "features": {"numeric": {"cost": 0.1}}}]
    >>> encoder.action_matrix(context, actions).shape
    (2, 16)
    >>> config.config_hash() == FeatureConfig(dimension=16, shared=True, interactions=True, normalize=False).config_hash()
    True
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

try:
    from learner import _fastscore
except ImportError:  # not built: the rows are built in Python
    _fastscore = None

__all__ = ["FEATURE_FORMAT", "FeatureConfig", "FeatureEncoder", "FrozenNormalizerError", "Normalizer"]

#: Version of the encoding itself (keys, hash, layout); part of every config hash.
FEATURE_FORMAT = 1

_SEP = "\x1f"
_PERSON = b"banditstream/f1"
_PHI = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_CACHE_LIMIT = 1 << 18

log = logging.getLogger(__name__)


def expected_colliding_pairs(keys: int, slots: int) -> float:
    """Expected number of pairs among ``keys`` distinct keys hashed uniformly into ``slots``
    slots that share a slot: ``keys * (keys - 1) / (2 * slots)``."""
    return keys * (keys - 1) / (2.0 * slots)


def dimension_for(keys: int, pairs: float = 0.1, intercept: bool = True) -> int:
    """The smallest power-of-two ``dimension`` that hashes ``keys`` keys with at most
    ``pairs`` expected colliding pairs."""
    dimension = 2
    while expected_colliding_pairs(keys, dimension - int(intercept)) > pairs:
        dimension *= 2
    return dimension


@dataclass(frozen=True)
class FeatureConfig:
    """How a domain's features are encoded; its :meth:`config_hash` travels with every vector.

    - ``dimension``: length of every vector, intercept included.
    - ``shared``: rows for one model shared across arms (action features, interactions) instead
      of the context vector for per-arm models.
    - ``interactions``: add hashed context x action products (needs ``shared``).
    - ``normalize``: z-score numeric features with the running statistics.
    - ``intercept``: slot 0 is a constant 1.0 (the policies put their prior mean there).
    - ``action_id``: in shared rows, hash the action id as a categorical action feature.
    - ``vector_dim``, ``action_vector_dim``: length of the optional dense vectors (0: none).
    - ``vector_layout``: ``hashed`` (the context vector's values hashed like named features),
      ``direct`` (value i in slot ``intercept + i``, exactly, and every hashed feature in the
      slots after them: an embedding passes through without collisions; ``dimension`` must
      leave room for both) or ``auto``, the default: ``direct`` when a ``vector_dim`` is
      declared and ``dimension`` leaves at least one hashed slot after it, else ``hashed``. It
      is resolved when the config is built, so ``to_dict`` and the hash name the layout used.
      A dict without the key (written before layouts existed) is ``hashed``, as it was then.
    - ``clip``: bound on the absolute z-score.
    - ``seed``: key of the hash; another seed gives an independent hashing.
    """

    dimension: int = 64
    shared: bool = False
    interactions: bool = False
    normalize: bool = True
    intercept: bool = True
    action_id: bool = True
    vector_dim: int = 0
    action_vector_dim: int = 0
    vector_layout: str = "auto"
    clip: float = 5.0
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("dimension", "vector_dim", "action_vector_dim", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an int, got {value!r}")
        for name in ("shared", "interactions", "normalize", "intercept", "action_id"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.dimension < 1 + int(self.intercept):
            raise ValueError(f"dimension must leave at least one hashed slot, got {self.dimension}")
        if self.vector_dim < 0 or self.action_vector_dim < 0:
            raise ValueError("vector_dim and action_vector_dim must be >= 0")
        if self.vector_layout not in ("auto", "hashed", "direct"):
            raise ValueError(f"vector_layout must be 'auto', 'hashed' or 'direct', got {self.vector_layout!r}")
        if self.vector_layout == "auto":  # a declared vector that fits passes through unhashed
            fits = 0 < self.vector_dim and int(self.intercept) + self.vector_dim + 1 <= self.dimension
            object.__setattr__(self, "vector_layout", "direct" if fits else "hashed")
        if self.vector_layout == "direct" and self.dimension < int(self.intercept) + self.vector_dim + 1:
            raise ValueError(f"dimension {self.dimension} leaves no hashed slot after the intercept and the {self.vector_dim} "
                             f"direct vector slots: give at least {int(self.intercept) + self.vector_dim + 1}")
        if self.interactions and not self.shared:
            raise ValueError("interactions need shared=True: per-arm models see the context vector only")
        if not (isinstance(self.clip, (int, float)) and self.clip > 0 and math.isfinite(self.clip)):
            raise ValueError(f"clip must be finite and > 0, got {self.clip!r}")
        if not 0 <= self.seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FeatureConfig:
        """The config of ``to_dict``'s output; without a ``vector_layout`` (a snapshot from
        before layouts existed) the vector was hashed."""
        return cls(**{"vector_layout": "hashed", **data})

    def config_hash(self) -> str:
        """First 16 hex digits of SHA-256 over the canonical JSON of every field and the format."""
        fields = {**self.to_dict(), "clip": float(self.clip), "format": FEATURE_FORMAT}
        if self.vector_layout == "hashed":  # (the hashes of configs from before the layout existed stay)
            del fields["vector_layout"]
        text = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class FrozenNormalizerError(RuntimeError):
    """A frozen normaliser (as shipped in a snapshot) was asked to learn."""


class Normalizer:
    """Running mean and variance per feature name (Welford), exportable as plain data.

        >>> n = Normalizer()
        >>> for x in (1.0, 2.0, 3.0, 4.0):
        ...     n.observe("c:tokens", x)
        >>> n.mean("c:tokens"), round(n.std("c:tokens"), 6), round(n.transform("c:tokens", 4.0), 6)
        (2.5, 1.118034, 1.341641)
        >>> Normalizer.from_export(n.export()).freeze().transform("c:tokens", 2.5)
        0.0
    """

    def __init__(self, stats: Mapping[str, Sequence[float]] | None = None, *, frozen: bool = False) -> None:
        #: name -> [count, mean, m2], floats (learner/_fastscore.c's hash_record reads them as such)
        self._stats: dict[str, list[float]] = {}
        for name, value in (stats or {}).items():
            count, mean, m2 = (float(v) for v in value)
            if not (count >= 0 and m2 >= 0 and all(map(math.isfinite, (count, mean, m2)))):
                raise ValueError(f"bad running statistics for {name!r}: {list(value)!r}")
            self._stats[str(name)] = [count, mean, m2]
        self._frozen = frozen

    @property
    def frozen(self) -> bool:
        return self._frozen

    def freeze(self) -> Normalizer:
        """A frozen copy: it transforms, it never learns (what the SDK scores with)."""
        return Normalizer(self._stats, frozen=True)

    def observe(self, name: str, value: float) -> None:
        """Fold one value of feature ``name`` into its running mean and variance."""
        if self._frozen:
            raise FrozenNormalizerError("this normaliser is frozen (a snapshot's); observe on the learner's copy")
        stat = self._stats.get(name)
        if stat is None:
            stat = self._stats[name] = [0.0, 0.0, 0.0]
        stat[0] += 1.0
        delta = value - stat[1]
        stat[1] += delta / stat[0]
        stat[2] += delta * (value - stat[1])

    def count(self, name: str) -> int:
        stat = self._stats.get(name)
        return 0 if stat is None else int(stat[0])

    def mean(self, name: str) -> float:
        stat = self._stats.get(name)
        return 0.0 if stat is None else stat[1]

    def std(self, name: str) -> float:
        """Population standard deviation (``numpy.std``'s default) of what was observed."""
        stat = self._stats.get(name)
        return 0.0 if stat is None or stat[0] == 0 else math.sqrt(stat[2] / stat[0])

    def transform(self, name: str, value: float, clip: float = math.inf) -> float:
        """The z-score of ``value``, clipped to [-clip, clip]; 0 without statistics or spread."""
        stat = self._stats.get(name)
        if stat is None or stat[2] <= 0.0:
            return 0.0
        z = (value - stat[1]) / math.sqrt(stat[2] / stat[0])
        return max(-clip, min(clip, z))

    def names(self) -> list[str]:
        return sorted(self._stats)

    def observations(self) -> int:
        """The count of the most observed feature: the decisions folded in, when one numeric
        feature comes with every decision (the normaliser records' ``update_count``)."""
        return int(max((stat[0] for stat in self._stats.values()), default=0))

    def export(self) -> dict[str, Any]:
        """Plain data: ``{"format": 1, "features": {name: [count, mean, m2]}}``."""
        return {"format": 1, "features": {name: list(stat) for name, stat in sorted(self._stats.items())}}

    @classmethod
    def merged(cls, normalizers: Iterable[Normalizer], *, frozen: bool = False) -> Normalizer:
        """The statistics of all the values the ``normalizers`` observed, as if one had seen
        them all (Chan et al.'s pairwise update of count, mean and sum of squared deviations).

            >>> a, b, both = Normalizer(), Normalizer(), Normalizer()
            >>> for x in (1.0, 2.0):
            ...     a.observe("x", x); both.observe("x", x)
            >>> for x in (3.0, 4.0, 5.0):
            ...     b.observe("x", x); both.observe("x", x)
            >>> m = Normalizer.merged([a, b])
            >>> (m.count("x"), m.mean("x"), round(m.std("x"), 12)) == (both.count("x"), both.mean("x"), round(both.std("x"), 12))
            True
        """
        stats: dict[str, list[float]] = {}
        for normalizer in normalizers:
            for name, (n_b, mean_b, m2_b) in normalizer._stats.items():
                held = stats.get(name)
                if held is None:
                    stats[name] = [n_b, mean_b, m2_b]
                    continue
                n_a, mean_a, m2_a = held
                n = n_a + n_b
                if n == 0:
                    continue
                delta = mean_b - mean_a
                stats[name] = [n, mean_a + delta * n_b / n, m2_a + m2_b + delta * delta * n_a * n_b / n]
        return cls(stats, frozen=frozen)

    @classmethod
    def from_export(cls, data: Mapping[str, Any], *, frozen: bool = False) -> Normalizer:
        if data.get("format") != 1 or not isinstance(data.get("features"), Mapping):
            raise ValueError("not a normaliser export (format 1)")
        return cls(data["features"], frozen=frozen)


class _Record(NamedTuple):
    """One Features record after hashing, as aligned Python lists (cheap to concatenate)."""

    h: list[int]  # 64-bit digests
    slot: list[int]
    weight: list[float]  # sign * value
    value: list[float]  # value alone (for interaction products)


class _HashPlan(NamedTuple):
    """What the compiled ``_fastscore.hash_record`` needs to hash one namespace's records as
    :meth:`FeatureEncoder._hash_record_python` does: the encoder's own caches and its hashing
    on a miss (so digests and cache contents are the Python path's), and the key prefixes.
    The field order is the C code's."""

    record: type
    normalizer: type  # whose instances' statistics are read in C (others: transform() is called)
    ns: str
    numeric: dict[str, tuple[str, int, int, float]]
    cache: dict[str, tuple[int, int, float]]
    numeric_key: Any  # FeatureEncoder._numeric_key
    lookup: Any  # FeatureEncoder._lookup
    clip: float
    categorical_prefix: str
    id_prefix: str
    sep: str
    vector_h: list[int]
    vector_slot: list[int]
    vector_sign: list[float]
    what: str  # for error messages


def _splitmix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x = x * _M1
    x = x ^ (x >> np.uint64(27))
    x = x * _M2
    return x ^ (x >> np.uint64(31))


class FeatureEncoder:
    """Encodes contexts and actions into float64 vectors under one :class:`FeatureConfig`.

    ``normalizer``: the running statistics to z-score with (a fresh one if omitted); pass a frozen
    one to score exactly as the snapshot's learner did. Keeps a cache of key digests.

        >>> encoder = FeatureEncoder(FeatureConfig(dimension=8, normalize=False))
        >>> v = encoder.context_vector({"numeric": {"x": 2.0}})
        >>> v[0], float(np.abs(v[1:]).sum())
        (np.float64(1.0), 2.0)
    """

    def __init__(self, config: FeatureConfig, normalizer: Normalizer | None = None) -> None:
        self.config = config
        self.normalizer = Normalizer() if normalizer is None else normalizer
        direct = config.vector_layout == "direct" and config.vector_dim
        #: the hashed slots: [offset, offset + m), after the intercept (and a direct vector's slots)
        self._offset = int(config.intercept) + (config.vector_dim if direct else 0)
        self._m = config.dimension - self._offset
        self._key = config.seed.to_bytes(8, "little")
        self._cache: dict[str, tuple[int, int, float]] = {}
        #: distinct keys hashed so far (exact until the digest cache is first cleared), and
        #: whether the collision warning was given (once per encoder)
        self._distinct_keys = 0
        self._collisions_warned = False
        #: per namespace, numeric feature name -> (normaliser name, digest, slot, sign)
        self._numeric: dict[str, dict[str, tuple[str, int, int, float]]] = {"c": {}, "a": {}}
        self._bare_actions: dict[str | None, _Record] = {}
        self._vectors = {
            "c": self._vector_layout("c", config.vector_dim),
            "a": self._vector_layout("a", config.action_vector_dim),
        }
        self._plans = {
            ns: _HashPlan(_Record, Normalizer, ns, self._numeric[ns], self._cache, self._numeric_key, self._lookup,
                          float(config.clip), f"{ns}{_SEP}c{_SEP}", f"{ns}{_SEP}id{_SEP}", _SEP, *self._vectors[ns],
                          "context" if ns == "c" else "action")
            for ns in ("c", "a")
        }  # fmt: skip

    @property
    def dimension(self) -> int:
        return self.config.dimension

    def config_hash(self) -> str:
        return self.config.config_hash()

    # --- hashing ---------------------------------------------------------------------------------

    def _lookup(self, key: str) -> tuple[int, int, float]:
        """(digest, slot, sign) of a feature key."""
        hit = self._cache.get(key)
        if hit is None:
            if len(self._cache) >= _CACHE_LIMIT:  # high-cardinality values: stay bounded
                self._cache.clear()
            digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8, key=self._key, person=_PERSON).digest()
            h = int.from_bytes(digest, "little")
            hit = self._cache[key] = (h, self._offset + h % self._m, -1.0 if h >> 63 else 1.0)
            self._distinct_keys += 1
            if not self._collisions_warned and expected_colliding_pairs(self._distinct_keys, self._m) >= 1.0:
                self._warn_collisions()
        return hit

    def _warn_collisions(self) -> None:
        """Once: the keys seen so far make a shared slot more likely than not (>= 1 expected
        colliding pair, P(any) ~ 63 %). Colliding features add into one weight."""
        self._collisions_warned = True
        n, m = self._distinct_keys, self._m
        log.warning(
            "features.dimension %d hashes %d distinct feature keys (so far) into %d slots: about %.1f pairs "
            "are expected to share a slot, adding their features together; dimension %d would keep that "
            "under 0.1 (at a cost: per-arm models grow with dimension squared)",
            self.config.dimension, n, m, expected_colliding_pairs(n, m), dimension_for(n, intercept=self.config.intercept),
        )

    def _numeric_key(self, ns: str, name: str) -> tuple[str, int, int, float]:
        """(normaliser name, digest, slot, sign) of numeric feature ``name`` in namespace ns."""
        keys = self._numeric[ns]
        if len(keys) >= _CACHE_LIMIT:
            keys.clear()
        hit = keys[name] = (f"{ns}:{name}", *self._lookup(f"{ns}{_SEP}n{_SEP}{name}"))
        return hit

    def _vector_layout(self, ns: str, n: int) -> tuple[list[int], list[int], list[float]]:
        """(digests, slots, signs) of a dense vector's values: hashed, or for a ``direct``
        context vector value i in slot ``intercept + i`` with sign +1 (its digests still pair
        it with action features in interactions)."""
        if ns == "c" and self.config.vector_layout == "direct":
            digests = [int.from_bytes(hashlib.blake2b(f"{ns}{_SEP}v{_SEP}{i}".encode(), digest_size=8, key=self._key,
                                                      person=_PERSON).digest(), "little") for i in range(n)]  # fmt: skip
            return digests, [int(self.config.intercept) + i for i in range(n)], [1.0] * n
        looked = [self._lookup(f"{ns}{_SEP}v{_SEP}{i}") for i in range(n)]
        return [h for h, _, _ in looked], [s for _, s, _ in looked], [g for _, _, g in looked]

    def _hash_record(self, features: Mapping[str, Any] | None, ns: str, action_id: str | None = None) -> _Record:
        """Hash one Features record (``numeric``, ``categorical``, ``vector``) in namespace ns:
        in C when built (records of plain dicts), else :meth:`_hash_record_python`."""
        if _fastscore is not None:
            normalizer = self.normalizer if self.config.normalize else None
            record = _fastscore.hash_record(self._plans[ns], features, action_id, normalizer)
            if record is not NotImplemented:
                return record
        return self._hash_record_python(features, ns, action_id)

    def _hash_record_python(self, features: Mapping[str, Any] | None, ns: str, action_id: str | None = None) -> _Record:
        """The reference of :meth:`_hash_record` (and the path without the compiled module)."""
        features = features or {}
        record = _Record([], [], [], [])
        hs, slots, weights, values = record
        normalize = self.config.normalize
        clip = float(self.config.clip)  # an int clip would put ints among the values
        lookup = self._lookup
        transform = self.normalizer.transform
        numeric_keys = self._numeric[ns]
        for name, x in (features.get("numeric") or {}).items():
            x = float(x)
            if not math.isfinite(x):
                raise ValueError(f"numeric feature {name!r} is {x}; features must be finite")
            stat, h, slot, sign = numeric_keys.get(name) or self._numeric_key(ns, name)
            if normalize:
                x = transform(stat, x, clip)
            hs.append(h)
            slots.append(slot)
            weights.append(sign * x)
            values.append(x)
        categorical = [f"{ns}{_SEP}c{_SEP}{name}{_SEP}{value}" for name, value in (features.get("categorical") or {}).items()]
        if action_id is not None:
            categorical.append(f"{ns}{_SEP}id{_SEP}{action_id}")
        for key in categorical:
            h, slot, sign = lookup(key)
            hs.append(h)
            slots.append(slot)
            weights.append(sign)
            values.append(1.0)
        vector = features.get("vector")
        if vector is not None and len(vector):
            layout_h, layout_slot, layout_sign = self._vectors[ns]
            if len(vector) != len(layout_h):
                what = "context" if ns == "c" else "action"
                raise ValueError(f"{what} vector has {len(vector)} values, but the feature config expects {len(layout_h)}")
            v = [float(x) for x in vector]
            if not all(map(math.isfinite, v)):
                raise ValueError(f"{'context' if ns == 'c' else 'action'} vector must be finite")
            hs += layout_h
            slots += layout_slot
            weights += [g * x for g, x in zip(layout_sign, v)]
            values += v
        return record

    def _assemble(self, rows: Sequence[tuple[_Record, _Record | None]]) -> np.ndarray:
        """(n, d) matrix, row i from its (context, action or None) pair, in one bincount.

        Interactions pair each row's context features with its action features, vectorised
        over all rows: pair j of row i is (context feature j // m_a, action feature j % m_a).
        """
        d = self.config.dimension
        n = len(rows)
        if _fastscore is not None:  # the same sums, in the same order, without the lists
            out = np.zeros((n, d))
            _fastscore.assemble(out, rows, self.config.interactions, self._offset, self._m, self.config.intercept)
            return out
        c_slot: list[int] = []
        c_weight: list[float] = []
        a_slot: list[int] = []
        a_weight: list[float] = []
        c_n = np.zeros(n, dtype=np.intp)
        a_n = np.zeros(n, dtype=np.intp)
        for i, (ctx, act) in enumerate(rows):
            c_slot += ctx.slot
            c_weight += ctx.weight
            c_n[i] = len(ctx.slot)
            if act is not None:
                a_slot += act.slot
                a_weight += act.weight
                a_n[i] = len(act.slot)
        row = np.arange(n) * d
        index = [np.array(c_slot, dtype=np.intp) + np.repeat(row, c_n), np.array(a_slot, dtype=np.intp) + np.repeat(row, a_n)]
        weight = [np.array(c_weight, dtype=np.float64), np.array(a_weight, dtype=np.float64)]
        pairs = c_n * a_n
        if self.config.interactions and pairs.any():
            pair_row = np.repeat(np.arange(n), pairs)
            offset = np.arange(int(pairs.sum())) - np.repeat(np.cumsum(pairs) - pairs, pairs)
            per_action = a_n[pair_row]
            ci = np.repeat(np.cumsum(c_n) - c_n, pairs) + offset // per_action
            ai = np.repeat(np.cumsum(a_n) - a_n, pairs) + offset % per_action
            c_h = np.array([h for ctx, _ in rows for h in ctx.h], dtype=np.uint64)
            c_v = np.array([v for ctx, _ in rows for v in ctx.value], dtype=np.float64)
            a_h = np.array([h for _, act in rows if act is not None for h in act.h], dtype=np.uint64)
            a_v = np.array([v for _, act in rows if act is not None for v in act.value], dtype=np.float64)
            mixed = _splitmix((c_h[ci] * _PHI) ^ a_h[ai])
            slots = (mixed % np.uint64(self._m)).astype(np.intp) + self._offset
            signs = 1.0 - 2.0 * (mixed >> np.uint64(63)).astype(np.float64)
            index.append(slots + pair_row * d)
            weight.append(signs * c_v[ci] * a_v[ai])
        out = np.bincount(np.concatenate(index), np.concatenate(weight), minlength=n * d).reshape(n, d)
        if self.config.intercept:
            out[:, 0] = 1.0
        return out

    def _row(self, record: _Record) -> np.ndarray:
        """(d,) vector of one record alone: :meth:`_assemble` for one row, without its fixed
        numpy costs; the sums are the same, added in the same order, so the bits are too."""
        row = [0.0] * self.config.dimension
        for slot, weight in zip(record.slot, record.weight):
            row[slot] += weight
        if self.config.intercept:
            row[0] = 1.0
        return np.array(row)

    def _action_records(self, actions: Sequence[Mapping[str, Any]]) -> list[_Record]:
        use_id = self.config.action_id
        return [self._action_record(action.get("features"), str(action["id"]) if use_id else None) for action in actions]

    def _action_record(self, features: Mapping[str, Any] | None, action_id: str | None) -> _Record:
        """One action's record; an action without features is hashed once per id (the same
        candidates come back call after call, and records are only read)."""
        vector = features.get("vector") if features else None
        if features and (features.get("numeric") or features.get("categorical") or (vector is not None and len(vector))):
            return self._hash_record(features, "a", action_id)
        hit = self._bare_actions.get(action_id)
        if hit is None:
            if len(self._bare_actions) >= _CACHE_LIMIT:
                self._bare_actions.clear()
            hit = self._bare_actions[action_id] = self._hash_record(None, "a", action_id)
        return hit

    # --- public encoding -------------------------------------------------------------------------

    def context_vector(self, context: Mapping[str, Any]) -> np.ndarray:
        """The context alone as a (d,) vector: the row of every candidate for per-arm models."""
        return self._row(self._hash_record(context, "c"))

    def action_matrix(self, context: Mapping[str, Any], actions: Sequence[Mapping[str, Any]]) -> np.ndarray:
        """(K, d) candidate rows for :meth:`Policy.probabilities`.

        Per-arm models: the context vector repeated (a copy per row: at K rows of d floats, cheaper
        than the Python-level work of a broadcast view);
        shared models: row k = intercept + context + action k (+ interactions).
        """
        if not actions:
            raise ValueError("actions must not be empty")
        ctx = self._hash_record(context, "c")
        if not self.config.shared:
            if _fastscore is not None:  # the sums of _row, in C, straight into every row
                rows = np.empty((len(actions), self.config.dimension))
                _fastscore.repeated_row(rows, ctx.slot, ctx.weight, self.config.intercept)
                return rows
            return self._row(ctx)[None, :].repeat(len(actions), axis=0)  # cheaper than np.broadcast_to here
        return self._assemble([(ctx, act) for act in self._action_records(actions)])

    def acted_matrix(self, events: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """(n, d): for each DecisionEvent, the row of its ``chosen`` action (what the learner folds in)."""
        rows: list[tuple[_Record, _Record | None]] = []
        for event in events:
            ctx = self._hash_record(event.get("context"), "c")
            actions = event["actions"]
            chosen = event["chosen"]
            if not 0 <= chosen < len(actions):
                raise ValueError(f"chosen index {chosen} is out of range for {len(actions)} actions")
            act = self._action_records([actions[chosen]])[0] if self.config.shared else None
            rows.append((ctx, act))
        if not rows:
            return np.zeros((0, self.config.dimension))
        return self._assemble(rows)

    def context_matrix(self, contexts: Iterable[Mapping[str, Any]]) -> np.ndarray:
        """(n, d) context vectors of many contexts in one pass."""
        rows = [(self._hash_record(context, "c"), None) for context in contexts]
        if not rows:
            return np.zeros((0, self.config.dimension))
        return self._assemble(rows)

    def categorical_slots(self, name: str, values: Sequence[str]) -> list[int]:
        """Vector coordinates of context categorical ``name=value`` for each value, e.g. the
        ``segment_slots`` of :class:`~learner.policies.beta_ts.BetaTS`.

        Raises ValueError when two of the values hash to one slot (choose another ``seed`` or a
        larger ``dimension``). A value not listed, or another feature, can still land on a
        listed value's slot and be read as that segment: size ``dimension`` with that in mind.
        """
        slots = [self._lookup(f"c{_SEP}c{_SEP}{name}{_SEP}{value}")[1] for value in values]
        if len(set(slots)) != len(slots):
            clash = [v for v, s in zip(values, slots) if slots.count(s) > 1]
            raise ValueError(f"values {clash!r} of {name!r} collide in one slot; change the seed or the dimension")
        return slots

    # --- normalisation ---------------------------------------------------------------------------

    def observe(self, context: Mapping[str, Any], actions: Sequence[Mapping[str, Any]] = ()) -> None:
        """Fold a decision's numeric features into the normaliser (context and, for shared
        models, the actions'). Call after encoding it, so a value never normalises itself."""
        for name, x in ((context or {}).get("numeric") or {}).items():
            self.normalizer.observe(f"c:{name}", float(x))
        if self.config.shared:
            for action in actions:
                for name, x in ((action.get("features") or {}).get("numeric") or {}).items():
                    self.normalizer.observe(f"a:{name}", float(x))

    def observe_events(self, events: Iterable[Mapping[str, Any]]) -> None:
        for event in events:
            self.observe(event.get("context") or {}, event.get("actions") or ())
