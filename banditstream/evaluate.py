"""`banditstream evaluate`: rate candidate policies on a logged domain, off-policy.

The workflow, in order:

1. **Read the log** (:func:`load_log`): the joined log of one tenant/workspace/domain from the
   updates topic (optionally a decision-time range), from Avro files of UpdateEvents, or from
   what ``replay`` reads (a JSONL interaction log, Avro files of decision and reward events:
   joined here with the domain's reward engine, features hashed by the domain's encoder).
2. **Candidates** (:func:`parse_candidates`): ``uniform``, ``logging``, ``always:ARM``,
   ``snapshot:VERSION`` or ``snapshot:CHANNEL`` (verified from the repository, as a client
   pulls it), ``shadow`` or ``shadow:VERSION`` (the distributions a shadow policy logged beside
   the decisions, on the rows that carry them), and policy specs trained progressively on the
   log, with grids: ``lin_ts(v=0.1|0.3|1,eps0=0|0.05)`` is six candidates.
3. **Estimate** (:func:`evaluate_candidates`): one cross-fitted reward model for the
   model-based estimators, then every candidate's ``action_dist`` from its own decision code
   and every estimator with its interval and diagnostics, all on the same rows.
4. **Report**: a table (:func:`results_table`), a forest plot (:func:`forest_plot`) with the
   logging policy's on-policy value as the reference line, and JSON (:meth:`Evaluation.to_dict`).

    >>> candidates = parse_candidates("uniform,always:gpt-large,shadow:1.2.0,lin_ucb(alpha=0.1|1.0)", snapshots=None)
    >>> [c.name for c in candidates]
    ['uniform', 'always:gpt-large', 'shadow:1.2.0', 'lin_ucb(alpha=0.1)', 'lin_ucb(alpha=1.0)']
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


from banditstream.replay import joined_events
from learner.domain import DomainSettings
from learner.evaluation import AlwaysArm, Candidate, Fixed, LoggedBandit, Logging, Progressive, Recommended, Uniform
from learner.evaluation.run import CandidateResult, Evaluation, evaluate_candidates
from streams.errors import BanditstreamError

__all__ = [
    "CandidateResult",
    "Evaluation",
    "EvaluationInputError",
    "evaluate_candidates",
    "forest_plot",
    "load_log",
    "parse_candidates",
    "results_table",
]

class EvaluationInputError(BanditstreamError):
    """A candidate spec, estimator name or log source that cannot be used (one line)."""

    reason = "evaluate"

    def __init__(self, message: str) -> None:
        Exception.__init__(self, message)


# -- 1. the log ----------------------------------------------------------------------------


def load_log(
    source: str,
    *,
    domain: str,
    domain_settings: DomainSettings,
    tenant: str = "default",
    workspace: str = "main",
    read_topic: Callable[[str], list[dict]] | None = None,
    since_ms: int | None = None,
    until_ms: int | None = None,
) -> LoggedBandit:
    """The domain's logged rows from ``source``: ``topic`` or ``topic:NAME`` (through
    ``read_topic(name)``, which reads the updates topic, None meaning the configured one), or
    comma-separated files (``.avro`` of UpdateEvents or of decision/reward events, ``.jsonl``)."""
    from streams.evaluation_log import LogRange, read_update_files

    log_range = LogRange(since_ms=since_ms, until_ms=until_ms)
    if source == "topic" or source.startswith("topic:"):
        if read_topic is None:
            raise EvaluationInputError("reading the log from a topic needs a broker")
        updates = [u for u in read_topic(source[6:] or None) if log_range.keeps(u)]
    else:
        paths = [Path(p) for p in source.split(",") if p]
        missing = [str(p) for p in paths if not p.exists()]
        if not paths or missing:
            raise EvaluationInputError(f"--log: no such file {', '.join(missing) or source!r} (give 'topic', "
                                       "'topic:NAME' or .avro/.jsonl files)")
        updates = []
        for path in paths:
            if path.suffix == ".avro" and _holds_updates(path):
                updates += read_update_files([path], log_range=log_range)[0]
            else:
                updates += [u for u in joined_events(path, domain, domain_settings, tenant=tenant, workspace=workspace)
                            if log_range.keeps(u)]
    try:
        log = LoggedBandit.from_updates(updates, domain=domain, tenant=tenant, workspace=workspace)
    except ValueError as exc:
        raise EvaluationInputError(str(exc)) from None
    if len(log) == 0:
        raise EvaluationInputError(f"no live decisions of {tenant}/{workspace}/{domain} in {source!r}")
    return log


def _holds_updates(path: Path) -> bool:
    import fastavro

    with open(path, "rb") as handle:
        return fastavro.reader(handle).writer_schema.get("name", "").endswith("UpdateEvent")


# -- 2. candidates -------------------------------------------------------------------------


def _split_top(text: str) -> list[str]:
    """Split on commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append(current.strip())
            current = ""
        else:
            current += char
    parts.append(current.strip())
    return [p for p in parts if p]


def _value(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(lowered)
    except ValueError:
        pass
    try:
        return float(lowered)
    except ValueError:
        raise EvaluationInputError(f"candidate parameter value {text!r} is not a number") from None


_SPEC = re.compile(r"^(?P<policy>[a-z_0-9]+)(\((?P<params>.*)\))?$")


def check_candidates(candidates: Sequence[Candidate], log: LoggedBandit) -> None:
    """Every candidate can score ``log`` (a shared model needs a shared model's log, and a
    per-arm one a per-arm model's); else :class:`EvaluationInputError`, naming it."""
    for candidate in candidates:
        try:
            candidate.check(log)
        except ValueError as exc:
            raise EvaluationInputError(f"{candidate.name}: {exc}") from None


def parse_candidates(
    text: str,
    *,
    snapshots: Callable[[str], tuple[Any, str]] | None,
    batch_size: int = 200,
    seed: int = 0,
) -> list[Candidate]:
    """Candidates from their specs (see the module's doc). ``snapshots(version_or_channel)``
    returns (a scoring policy, its version) from the repository."""
    out: list[Candidate] = []
    for spec in _split_top(text):
        if spec == "uniform":
            out.append(Uniform())
        elif spec == "logging":
            out.append(Logging())
        elif spec.startswith("always:") and len(spec) > 7:
            out.append(AlwaysArm(spec[7:]))
        elif spec == "shadow" or (spec.startswith("shadow:") and len(spec) > 7):
            out.append(Recommended(spec[7:] or None))
        elif spec.startswith("snapshot:") and len(spec) > 9:
            if snapshots is None:
                raise EvaluationInputError(f"candidate {spec!r} needs the snapshot repository")
            policy, version = snapshots(spec[9:])
            out.append(Fixed(policy, f"snapshot:{version}", seed=seed))
        else:
            match = _SPEC.match(spec)
            if match is None:
                raise EvaluationInputError(
                    f"candidate {spec!r} is none of uniform, logging, always:ARM, snapshot:VERSION|CHANNEL, "
                    "shadow[:VERSION], POLICY(param=v1|v2,...)"
                )
            grid: dict[str, list[Any]] = {}
            for item in _split_top((match["params"] or "").replace(" ", "")):
                name, sep, values = item.partition("=")
                if not sep or not name or not values:
                    raise EvaluationInputError(f"candidate {spec!r}: {item!r} is not param=value[|value...]")
                grid[name] = [_value(v) for v in values.split("|")]
            for combo in itertools.product(*grid.values()) if grid else [()]:
                params = dict(zip(grid, combo))
                try:
                    candidate = Progressive(match["policy"], params, batch_size=batch_size, seed=seed)
                    from learner.policies import make_policy

                    make_policy(match["policy"], dim=1, **params)  # bad hyper-parameters fail here, by name
                except (TypeError, ValueError) as exc:
                    raise EvaluationInputError(f"candidate {spec!r}: {exc}") from None
                out.append(candidate)
    if not out:
        raise EvaluationInputError("--candidates names no candidate")
    names = [c.name for c in out]
    if len(set(names)) != len(names):
        raise EvaluationInputError(f"--candidates names one twice: {sorted(n for n in set(names) if names.count(n) > 1)}")
    return out


# -- 3. estimates: learner.evaluation.run -------------------------------------------------


# -- 4. reports ----------------------------------------------------------------------------


def results_table(run: Evaluation):
    """Candidates best first, one row per estimator (readable at 80 columns)."""
    from rich.table import Table

    tenant, workspace, domain = run.scope
    notes = any(e.warnings for r in run.results for e in r.estimates.values())
    table = Table(title=f"{tenant}/{workspace}/{domain}: {run.rows:,} logged decisions, "
                        f"on-policy value {run.on_policy_value:.4f}")
    table.add_column("candidate", overflow="fold", max_width=30)
    table.add_column("est.", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column(f"{int(round(100 * _level(run)))}% interval", no_wrap=True)
    table.add_column("ESS", justify="right", no_wrap=True)
    table.add_column("max w", justify="right", no_wrap=True)
    if notes:
        table.add_column("warnings", overflow="fold")
    for result in run.ranked():
        for name in run.estimators:
            e = result.estimates[name]
            row = [_label(result, run) if name == run.estimators[0] else "", name, f"{e.estimate:.4f}",
                   f"{e.lower:.4f}-{e.upper:.4f}", f"{e.ess:,.0f}", f"{e.max_weight:.1f}"]
            table.add_row(*row, *(["; ".join(e.warnings)] if notes else []))
        table.add_section()
    return table


def _label(result: CandidateResult, run: Evaluation) -> str:
    """The candidate's name, and the rows it was estimated on when they are not all the log's."""
    return result.name if result.rows == run.rows else f"{result.name} ({result.rows:,} of {run.rows:,} rows)"


def _level(run: Evaluation) -> float:
    return next(iter(run.results[0].estimates.values())).level if run.results else 0.95


def forest_plot(run: Evaluation, path: str | Path) -> Path:
    """Each candidate's estimate and interval per estimator; the logging policy's on-policy
    value as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranked = run.ranked()
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ranked) * len(run.estimators) + 1.5))
    y, labels = 0, []
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for result in reversed(ranked):
        for j, name in enumerate(run.estimators):
            e = result.estimates[name]
            ax.errorbar(e.estimate, y, xerr=[[e.estimate - e.lower], [e.upper - e.estimate]], fmt="o", capsize=3,
                        color=colors[j % len(colors)], label=name if result is ranked[-1] else None)
            labels.append(f"{_label(result, run)} · {name}")
            y += 1
        y += 0.5
    ticks = [i + 0.5 * (i // len(run.estimators)) for i in range(len(labels))]
    ax.set_yticks(ticks, labels, fontsize=8)
    ax.axvline(run.on_policy_value, linestyle="--", color="grey", label="logging policy (on-policy)")
    ax.set_xlabel(f"estimated value ({int(round(100 * _level(run)))}% interval)")
    ax.set_title(f"{'/'.join(run.scope)}: {run.rows:,} logged decisions")
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
