"""The reward engine: from a reward event's named signals to the scalar a policy learns.

Each domain declares its reward in config (:class:`RewardConfig`, a pydantic model that a
YAML file or a plain dict fills). For one reward event with signals ``s``::

    raw(s) = constant
           + sum over terms   weight * clamp(x / scale, floor, cap),  x = s[signal] or default
           - sum over gates   penalty * P,  P = 1 if any listed condition holds, else 0

    reward = clip(raw(s), clip)                      # clip = [min, max], if configured

A gate's condition is ``s[x] < threshold`` for each ``when_below`` entry and
``s[x] > threshold`` for each ``when_above`` entry (strict). A signal missing from the event
passes its condition (``when_missing: pass``, the default) or fires it
(``when_missing: fire``) - choose ``fire`` when the absence of a quality score should itself
count as a miss.

Rules a user can rely on:

* **A plain value wins.** When a reward event carries ``value``, that number is the event's
  raw reward as-is: no terms, gates or constant apply; its signals are kept only for audit.
  Clipping still applies, because the clip range is a bound on what the learner sees
  (a Beta-Bernoulli policy needs rewards in ``[0, 1]`` whatever their source).
* **Missing signals take the term's default** (0 unless configured). The default stands
  in for the raw signal, so it is normalised and capped like a real observation
  (``default: 5000`` on a ``latency_ms`` term means "assume 5 s when not reported").
* **NaN and infinity are refused** (:class:`~learner.errors.InvalidReward`) for the value
  and for every signal a term or gate reads; signals no term reads are not inspected.
* **Several rewards for one decision** (within the wait window ``window_s``) are combined
  by :meth:`RewardEngine.aggregate`: each event is scored to its *unclipped* raw reward,
  the raws are aggregated with the domain's mode (``sum``, ``first``, ``last``, ``max``,
  ``min``, ``mean``), and the result is clipped once. Events are ordered by
  ``(timestamp, reward_id)`` so ``first``/``last`` are deterministic, and a ``reward_id``
  seen twice counts once. Summing scalar rewards is what makes split reports work: an
  event carrying ``success`` and a later one carrying ``latency_ms`` sum to the reward of
  both signals together for any config without caps on the split signals.
* **Audit signals** returned beside the reward are aggregated per signal name with the
  same mode, each over the events that carry that signal (``last`` gives each signal's
  latest report, ``sum`` its total, ...). They are for audit and re-weighting, never for
  the reward itself.
* **No reward in the window**: the join uses :attr:`RewardEngine.default_reward`
  (``default_reward``, 0 unless configured; it must lie inside the clip range).

The compact form users think in is accepted too; weights, ``signal/scale``,
``min(x, cap)``, ``max(x, floor)`` and bracketed gates ``[F < 0.75 or R < 0.75]`` (a gate
term ``- w*[...]`` is a penalty of ``w``)::

    >>> engine = RewardEngine(RewardConfig.from_expression(
    ...     "2.0*success - 0.5*min(latency_ms/2000, 2) - 1.0*[quality < 0.75]", clip=(-2, 2)))
    >>> engine.score({"success": 1, "latency_ms": 1000, "quality": 0.9})
    1.75
    >>> engine.score({"success": 1, "latency_ms": 9000, "quality": 0.5})
    0.0
    >>> engine.score(value=7.0)     # a plain value is used as-is, then clipped
    2.0
    >>> reward, signals, count = engine.aggregate([
    ...     {"reward_id": "b", "timestamp": 2, "signals": {"latency_ms": 1000}},
    ...     {"reward_id": "a", "timestamp": 1, "signals": {"success": 1, "quality": 0.9}},
    ... ])
    >>> reward, count
    (1.75, 2)
    >>> signals
    {'success': 1.0, 'quality': 0.9, 'latency_ms': 1000.0}
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Literal, NamedTuple

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from learner.errors import InvalidReward, RewardExpressionError

__all__ = [
    "AggregatedReward",
    "AggregateMode",
    "Gate",
    "RewardConfig",
    "RewardEngine",
    "Term",
    "parse_expression",
]

AggregateMode = Literal["sum", "first", "last", "max", "min", "mean"]

SignalName = Annotated[
    str, StringConstraints(strip_whitespace=True, min_length=1, pattern=r"^[^\x00]+$")
]

# Key of the plain-value column among the signal columns; NUL cannot start a config name.
_VALUE = "\0value"

_STRICT = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class Term(BaseModel):
    """One weighted signal: ``weight * clamp(x / scale, floor, cap)``.

    ``x`` is the event's signal, or ``default`` when the event does not carry it.
    ``{signal: latency_ms, weight: -1.0, scale: 2000, cap: 2}`` is ``-min(latency_ms/2000, 2)``.
    """

    model_config = _STRICT

    signal: SignalName
    weight: float
    scale: float = Field(default=1.0, gt=0, description="Divides the signal before clamping.")
    floor: float | None = Field(default=None, description="Lower bound after scaling.")
    cap: float | None = Field(default=None, description="Upper bound after scaling.")
    default: float = Field(default=0.0, description="Raw signal value used when it is missing.")

    @model_validator(mode="after")
    def _floor_below_cap(self) -> Term:
        if self.floor is not None and self.cap is not None and self.floor > self.cap:
            raise ValueError(
                f"floor {self.floor} is above cap {self.cap} for signal {self.signal!r}"
            )
        return self


class Gate(BaseModel):
    """A penalty of ``penalty`` (subtracted) when any listed condition holds.

    ``{when_below: {F: 0.75, R: 0.75}, penalty: 1.0}`` subtracts 1 when F < 0.75 or R < 0.75;
    ``{when_above: {safety_flag: 0.5}, penalty: 3}`` subtracts 3 when the flag is raised.
    A negative penalty is a bonus.
    """

    model_config = _STRICT

    when_below: dict[SignalName, float] = Field(default_factory=dict)
    when_above: dict[SignalName, float] = Field(default_factory=dict)
    penalty: float
    when_missing: Literal["pass", "fire"] = Field(
        default="pass", description="Whether a listed signal the event lacks fires the gate."
    )

    @model_validator(mode="after")
    def _has_condition(self) -> Gate:
        if not self.when_below and not self.when_above:
            raise ValueError("a gate needs at least one condition in when_below or when_above")
        return self


class RewardConfig(BaseModel):
    """A domain's reward settings: the formula, clipping, aggregation, default and window.

    Build it from a dict (``RewardConfig.model_validate(yaml.safe_load(...))``), or from the
    compact expression either with :meth:`from_expression` or by giving ``expression``
    instead of ``terms``/``gates``/``constant`` in the dict.
    """

    model_config = _STRICT

    terms: tuple[Term, ...] = ()
    gates: tuple[Gate, ...] = ()
    constant: float = 0.0
    clip: tuple[float, float] | None = Field(
        default=None, description="[min, max] bounds on the final reward."
    )
    aggregate: AggregateMode = Field(
        default="sum", description="How several reward events for one decision combine."
    )
    default_reward: float = Field(
        default=0.0, description="The reward of a decision no reward event arrived for."
    )
    window_s: float = Field(
        default=600.0, gt=0, description="How long the join waits for rewards after a decision."
    )
    expression: str | None = Field(
        default=None,
        exclude=True,
        repr=False,
        description="Compact form of terms, gates and constant; expanded on validation.",
    )

    @model_validator(mode="before")
    @classmethod
    def _expand_expression(cls, data: Any) -> Any:
        if not isinstance(data, Mapping) or not isinstance(data.get("expression"), str):
            return data
        clash = sorted({"terms", "gates", "constant"} & set(data))
        if clash:
            raise ValueError(f"give either expression or {', '.join(clash)}, not both")
        try:
            parsed = parse_expression(data["expression"])
        except RewardExpressionError:
            return data  # the `expression` field validator reports it, located at that field
        expanded = {key: value for key, value in data.items() if key != "expression"}
        expanded.update(parsed)
        return expanded

    @field_validator("expression")
    @classmethod
    def _expression_parses(cls, value: str | None) -> None:
        # Reached with a string only when the expansion above failed: re-raise its error.
        if value is not None:
            parse_expression(value)
        return None

    @field_validator("clip")
    @classmethod
    def _clip_ordered(cls, clip: tuple[float, float] | None) -> tuple[float, float] | None:
        if clip is not None and clip[0] > clip[1]:
            raise ValueError(f"clip min {clip[0]} is above clip max {clip[1]}")
        return clip

    @model_validator(mode="after")
    def _default_inside_clip(self) -> RewardConfig:
        if self.clip is not None:
            low, high = self.clip
            if not low <= self.default_reward <= high:
                raise ValueError(
                    f"default_reward {self.default_reward} is outside clip [{low}, {high}]"
                )
        return self

    @classmethod
    def from_expression(cls, expression: str, **settings: Any) -> RewardConfig:
        """The config for a compact expression plus the other settings as keywords.

        Raises :class:`~learner.errors.RewardExpressionError` (with a caret at the column)
        when the expression does not parse, pydantic's ``ValidationError`` when a setting is
        invalid.

            >>> RewardConfig.from_expression("2*success - 0.001*latency_ms", clip=(-1, 2)).terms[1]
            Term(signal='latency_ms', weight=-0.001, scale=1.0, floor=None, cap=None, default=0.0)
        """
        return cls.model_validate({**parse_expression(expression), **settings})


class AggregatedReward(NamedTuple):
    """What the join puts in an UpdateEvent for one decision."""

    reward: float
    signals: dict[str, float]
    count: int


class RewardEngine:
    """Scores reward events with one domain's :class:`RewardConfig`.

    The per-event methods (:meth:`score`, :meth:`aggregate`) are plain Python over the few
    terms a domain has, which beats numpy for one event; :meth:`score_batch` is the
    vectorised form for columns of events and gives bit-identical results.
    """

    def __init__(self, config: RewardConfig | Mapping[str, Any]) -> None:
        if not isinstance(config, RewardConfig):
            config = RewardConfig.model_validate(config)
        self._config = config
        self._terms = tuple(
            (t.signal, t.weight, t.scale, t.floor, t.cap, t.default) for t in config.terms
        )
        self._gates = tuple(
            (
                tuple(g.when_below.items()),
                tuple(g.when_above.items()),
                g.penalty,
                g.when_missing == "fire",
            )
            for g in config.gates
        )
        self._read = frozenset(t.signal for t in config.terms).union(
            *(set(g.when_below) | set(g.when_above) for g in config.gates)
        )
        self._clip = config.clip

    @property
    def config(self) -> RewardConfig:
        return self._config

    @property
    def default_reward(self) -> float:
        """The reward of a decision no reward event arrived for within the window."""
        return self._config.default_reward

    @property
    def window_s(self) -> float:
        """Seconds the join waits for reward events after a decision."""
        return self._config.window_s

    def config_hash(self) -> str:
        """16 hex digits identifying the reward definition (stable across processes).

        Equal configs hash equal however they were written (dict or expression).
        """
        canonical = json.dumps(
            self._config.model_dump(mode="json"), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16]

    # -- one event -------------------------------------------------------------------------

    def score(
        self, signals: Mapping[str, float] | None = None, value: float | None = None
    ) -> float:
        """The clipped reward of one event (``value`` as-is if given, else the formula)."""
        return self._clipped(self._raw(signals, value))

    def _raw(self, signals: Mapping[str, float] | None, value: float | None) -> float:
        if value is not None:
            value = float(value)
            if not math.isfinite(value):
                raise InvalidReward(f"reward value is {value}; a reward must be finite")
            return value
        signals = signals or {}
        for name in self._read.intersection(signals):
            if not math.isfinite(float(signals[name])):
                raise InvalidReward(f"signal {name!r} is {signals[name]}; signals must be finite")
        total = self._config.constant
        for signal, weight, scale, floor, cap, default in self._terms:
            x = float(signals.get(signal, default)) / scale
            if floor is not None and x < floor:
                x = floor
            if cap is not None and x > cap:
                x = cap
            total += weight * x
        for below, above, penalty, fire_missing in self._gates:
            if _gate_fires(signals, below, above, fire_missing):
                total -= penalty
        return total

    def _clipped(self, raw: float) -> float:
        if self._clip is None:
            return raw
        low, high = self._clip
        return min(max(raw, low), high)

    # -- several events for one decision ---------------------------------------------------

    def aggregate(self, rewards: Sequence[Any]) -> AggregatedReward:
        """Combine the reward events of one decision into ``(reward, signals, count)``.

        Each event is a mapping (a decoded RewardEvent) or an object with the attributes
        ``reward_id``, ``timestamp`` (epoch millis or a datetime), ``signals`` and
        ``value``. No events gives ``(default_reward, {}, 0)``.
        """
        if not rewards:
            return AggregatedReward(self.default_reward, {}, 0)
        if len(rewards) == 1:  # the usual case: what the general path gives, without its sorting
            event = rewards[0]
            signals = _field(event, "signals") or {}
            try:
                raw = self._raw(signals, _field(event, "value"))
            except InvalidReward as error:
                raise InvalidReward(f"reward {_field(event, 'reward_id')!r}: {error}") from None
            return AggregatedReward(self._clipped(raw), {name: float(x) for name, x in signals.items()}, 1)
        events = sorted(
            (
                (_millis(_field(r, "timestamp")), str(_field(r, "reward_id")), r)
                for r in rewards
            ),
            key=lambda item: item[:2],
        )
        unique, seen = [], set()
        for _, reward_id, event in events:
            if reward_id not in seen:
                seen.add(reward_id)
                unique.append(event)
        mode = self._config.aggregate
        raws = []
        for event in unique:
            try:
                raws.append(self._raw(_field(event, "signals"), _field(event, "value")))
            except InvalidReward as error:
                raise InvalidReward(f"reward {_field(event, 'reward_id')!r}: {error}") from None
        per_signal: dict[str, list[float]] = {}
        for event in unique:
            for name, x in (_field(event, "signals") or {}).items():
                per_signal.setdefault(name, []).append(float(x))
        signals = {name: _combine(mode, xs) for name, xs in per_signal.items()}
        return AggregatedReward(self._clipped(_combine(mode, raws)), signals, len(unique))

    # -- columns of events -----------------------------------------------------------------

    def score_batch(
        self,
        signals: Mapping[str, Any] | Sequence[Mapping[str, float] | None],
        values: Any = None,
    ) -> np.ndarray:
        """Vectorised :meth:`score` over n events; returns float64 of shape (n,).

        ``signals`` is either columnar (signal name -> array of n floats, **NaN marking
        "not reported"**) or a sequence of n per-event mappings (or None). ``values`` is
        None, or n plain values with NaN (columnar) / None (sequence) for "no value".
        Infinity anywhere a term or gate reads, and NaN inside a per-event mapping, raise
        :class:`~learner.errors.InvalidReward` naming the row.
        """
        columns, n = self._columns(signals, values)
        total = np.full(n, self._config.constant, dtype=np.float64)
        for signal, weight, scale, floor, cap, default in self._terms:
            column = columns.get(signal)
            x = np.full(n, default, dtype=np.float64) if column is None else np.where(
                np.isnan(column), default, column
            )
            x = x / scale
            if floor is not None:
                np.maximum(x, floor, out=x)
            if cap is not None:
                np.minimum(x, cap, out=x)
            total += weight * x
        for below, above, penalty, fire_missing in self._gates:
            fired = np.zeros(n, dtype=bool)
            for conditions, holds in ((below, np.less), (above, np.greater)):
                for signal, threshold in conditions:
                    column = columns.get(signal)
                    if column is None:
                        if fire_missing:
                            fired[:] = True
                        continue
                    fired |= holds(column, threshold)
                    if fire_missing:
                        fired |= np.isnan(column)
            total -= penalty * fired
        value_column = columns.get(_VALUE)
        if value_column is not None:
            total = np.where(np.isnan(value_column), total, value_column)
        if self._clip is not None:
            np.clip(total, self._clip[0], self._clip[1], out=total)
        return total

    def _columns(self, signals: Any, values: Any) -> tuple[dict[str, np.ndarray], int]:
        """The read signals as float64 columns (NaN = missing), plus the value column."""
        if isinstance(signals, Mapping):
            columns = {
                name: np.asarray(signals[name], dtype=np.float64).reshape(-1)
                for name in self._read.intersection(signals)
            }
            lengths = {f"signal {name!r}": len(column) for name, column in signals.items()}
            value_column = (
                None if values is None else np.asarray(values, dtype=np.float64).reshape(-1)
            )
        else:
            rows = [row or {} for row in signals]
            for i, row in enumerate(rows):
                for name in self._read.intersection(row):
                    if not math.isfinite(float(row[name])):
                        raise InvalidReward(f"row {i}: signal {name!r} is {row[name]}")
            columns = {
                name: np.array([row.get(name, np.nan) for row in rows], dtype=np.float64)
                for name in self._read
                if any(name in row for row in rows)
            }
            lengths = {"signals": len(rows)}
            value_column = None
            if values is not None:
                value_list = list(values)
                for i, v in enumerate(value_list):
                    if v is not None and not math.isfinite(float(v)):
                        raise InvalidReward(f"row {i}: value is {v}")
                value_column = np.array(
                    [np.nan if v is None else float(v) for v in value_list], dtype=np.float64
                )
        if value_column is not None:
            lengths["values"] = len(value_column)
        if len(set(lengths.values())) > 1:
            described = ", ".join(f"{name}: {n}" for name, n in lengths.items())
            raise ValueError(f"score_batch needs columns of one length; got {described}")
        for name, column in columns.items():
            infinite = np.flatnonzero(np.isinf(column))
            if infinite.size:
                row = int(infinite[0])
                raise InvalidReward(f"row {row}: signal {name!r} is {column[row]}")
        if value_column is not None:
            infinite = np.flatnonzero(np.isinf(value_column))
            if infinite.size:
                row = int(infinite[0])
                raise InvalidReward(f"row {row}: value is {value_column[row]}")
            columns[_VALUE] = value_column
        return columns, next(iter(lengths.values()), 0)


def _gate_fires(
    signals: Mapping[str, float],
    below: tuple[tuple[str, float], ...],
    above: tuple[tuple[str, float], ...],
    fire_missing: bool,
) -> bool:
    for signal, threshold in below:
        x = signals.get(signal)
        if (fire_missing if x is None else float(x) < threshold):
            return True
    for signal, threshold in above:
        x = signals.get(signal)
        if (fire_missing if x is None else float(x) > threshold):
            return True
    return False


def _combine(mode: str, xs: Sequence[float]) -> float:
    if mode == "sum":
        return math.fsum(xs)
    if mode == "first":
        return xs[0]
    if mode == "last":
        return xs[-1]
    if mode == "max":
        return max(xs)
    if mode == "min":
        return min(xs)
    return math.fsum(xs) / len(xs)  # mean


def _field(event: Any, name: str) -> Any:
    if isinstance(event, Mapping):
        return event.get(name)
    return getattr(event, name, None)


_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.timezone.utc)


def _millis(timestamp: Any) -> int:
    """Epoch milliseconds of an Avro timestamp-millis as fastavro decodes it (or raw)."""
    if isinstance(timestamp, _dt.datetime):
        if timestamp.tzinfo is None:
            timestamp = timestamp.replace(tzinfo=_dt.timezone.utc)
        return (timestamp - _EPOCH) // _dt.timedelta(milliseconds=1)
    if timestamp is None:
        return 0
    return int(timestamp)


# -- the compact expression ----------------------------------------------------------------
#
#   expression := [sign] summand (sign summand)*
#   summand    := factor ('*' factor)*         at most one number and one signal or gate
#   factor     := NUMBER | signal | gate
#   signal     := NAME ['/' NUMBER] | ('min' | 'max') '(' signal ',' NUMBER ')'
#                                   | ('min' | 'max') '(' NUMBER ',' signal ')'
#   gate       := '[' NAME ('<' | '>') NUMBER (('or' | '|') NAME ('<' | '>') NUMBER)* ']'
#
# NUMBERs inside min/max and gates may carry a sign. Parsed by hand, never eval'd.

_TOKEN = re.compile(
    r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
    r"|(?P<op>[-+*/(),\[\]<>|]))"
)
_RESERVED = {"min", "max", "or"}


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens: list[tuple[str, str, int]] = []
        position = 0
        while True:
            while position < len(text) and text[position].isspace():
                position += 1
            if position == len(text):
                break
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                raise RewardExpressionError(
                    text, position, f"unexpected character {text[position]!r}"
                )
            kind = match.lastgroup
            assert kind is not None
            self.tokens.append((kind, match.group(kind), match.start(kind)))
            position = match.end()
        self.tokens.append(("end", "", len(text)))
        self.index = 0

    # token helpers
    def peek(self) -> tuple[str, str, int]:
        return self.tokens[self.index]

    def take(self) -> tuple[str, str, int]:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def fail(self, reason: str, column: int | None = None) -> RewardExpressionError:
        where = self.peek()[2] if column is None else column
        return RewardExpressionError(self.text, where, reason)

    def expect(self, op: str) -> None:
        kind, text, _ = self.peek()
        if kind != "op" or text != op:
            raise self.fail(f"expected {op!r}, found {_describe(self.peek())}")
        self.take()

    def number(self, signed: bool = False) -> float:
        sign = 1.0
        if signed and self.peek()[:2] in (("op", "-"), ("op", "+")):
            sign = -1.0 if self.take()[1] == "-" else 1.0
        kind, text, _ = self.peek()
        if kind != "number":
            raise self.fail(f"expected a number, found {_describe(self.peek())}")
        self.take()
        return sign * float(text)

    # grammar
    def parse(self) -> dict[str, Any]:
        if self.peek()[0] == "end":
            raise self.fail("the expression is empty")
        terms: list[dict[str, Any]] = []
        gates: list[dict[str, Any]] = []
        constant = 0.0
        sign = 1.0
        if self.peek()[:2] in (("op", "-"), ("op", "+")):
            sign = -1.0 if self.take()[1] == "-" else 1.0
        while True:
            weight, item = self.summand()
            if item is None:
                constant += sign * weight
            elif "penalty" in item:
                gates.append({**item, "penalty": -sign * weight})
            else:
                terms.append({**item, "weight": sign * weight})
            kind, text, _ = self.peek()
            if kind == "end":
                break
            if kind == "op" and text in "+-":
                self.take()
                sign = -1.0 if text == "-" else 1.0
                continue
            raise self.fail(f"expected '+', '-' or the end, found {_describe(self.peek())}")
        return {"terms": terms, "gates": gates, "constant": constant}

    def summand(self) -> tuple[float, dict[str, Any] | None]:
        weight: float | None = None
        item: dict[str, Any] | None = None
        while True:
            kind, text, column = self.peek()
            if kind == "number":
                if weight is not None:
                    raise self.fail("a term has one weight; found a second number")
                weight = self.number()
            elif (kind == "name") or (kind == "op" and text == "["):
                if item is not None:
                    raise self.fail(
                        "a term names one signal or gate; products of signals are not linear"
                    )
                item = self.gate() if text == "[" else self.signal()
            else:
                raise self.fail(
                    "expected a number, a signal name, min(...), max(...) or a [gate], "
                    f"found {_describe(self.peek())}"
                )
            if self.peek()[:2] != ("op", "*"):
                break
            self.take()
        return (1.0 if weight is None else weight), item

    def signal(self) -> dict[str, Any]:
        kind, name, column = self.peek()
        if kind != "name":
            raise self.fail(f"expected a signal name, found {_describe(self.peek())}")
        self.take()
        if name in ("min", "max"):
            self.expect("(")
            if self.peek()[0] == "number" or self.peek()[:2] in (("op", "-"), ("op", "+")):
                bound = self.number(signed=True)
                self.expect(",")
                inner = self.signal()
            else:
                inner = self.signal()
                self.expect(",")
                bound = self.number(signed=True)
            self.expect(")")
            key = "cap" if name == "min" else "floor"
            previous = inner.get(key)
            if previous is not None:
                bound = min(bound, previous) if key == "cap" else max(bound, previous)
            inner[key] = bound
            floor, cap = inner.get("floor"), inner.get("cap")
            if floor is not None and cap is not None and floor > cap:
                raise self.fail(f"floor {floor} is above cap {cap}", column)
            return inner
        if name in _RESERVED:
            raise self.fail(f"{name!r} is reserved and cannot name a signal", column)
        if self.peek()[:2] == ("op", "("):
            raise self.fail(f"unknown function {name!r}; only min(...) and max(...) exist", column)
        term: dict[str, Any] = {"signal": name}
        if self.peek()[:2] == ("op", "/"):
            self.take()
            divisor_column = self.peek()[2]
            scale = self.number()
            if scale <= 0:
                raise self.fail("a signal can only be divided by a positive number", divisor_column)
            term["scale"] = scale
        return term

    def gate(self) -> dict[str, Any]:
        self.expect("[")
        below: dict[str, float] = {}
        above: dict[str, float] = {}
        while True:
            kind, name, column = self.peek()
            if kind != "name" or name in _RESERVED:
                found = _describe(self.peek())
                raise self.fail(f"expected a signal name in the gate, found {found}")
            self.take()
            kind, op, _ = self.peek()
            if kind != "op" or op not in "<>":
                found = _describe(self.peek())
                raise self.fail(f"expected '<' or '>' after {name!r}, found {found}")
            self.take()
            (below if op == "<" else above)[name] = self.number(signed=True)
            kind, text, _ = self.peek()
            if (kind, text) in (("name", "or"), ("op", "|")):
                self.take()
                continue
            self.expect("]")
            return {"when_below": below, "when_above": above, "penalty": 0.0}


def _describe(token: tuple[str, str, int]) -> str:
    kind, text, _ = token
    return "the end" if kind == "end" else repr(text)


def parse_expression(expression: str) -> dict[str, Any]:
    """Parse a compact reward expression into ``{"terms", "gates", "constant"}`` dicts.

    ``"2*success - 0.5*min(latency_ms/2000, 2) - 1*[F < 0.75 or R < 0.75] + 0.1"`` gives
    two terms (weights 2 and -0.5, the second scaled by 2000 and capped at 2), one gate with
    penalty 1, and a constant 0.1. Raises :class:`~learner.errors.RewardExpressionError`.
    """
    if not isinstance(expression, str):
        raise TypeError(f"a reward expression is a string, got {type(expression).__name__}")
    return _Parser(expression).parse()
