"""Typed errors of the learner's reward engine and posterior store.

Callers catch by meaning: a worker dead-letters a record on :class:`InvalidReward`, stops
and alerts on :class:`StoreCorruption` (the state cannot be trusted; restore a checkpoint
or rebuild the shard by replaying the updates topic), and treats :class:`OffsetRegression`
as a bug in its own offset bookkeeping.

    LearnerError
    ├── RewardError
    │   ├── RewardExpressionError   (also a ValueError: a reward expression did not parse)
    │   └── InvalidReward           (also a ValueError: a value or signal is NaN or inf)
    └── StoreError
        ├── InvalidKey              (also a ValueError: an id that cannot be encoded as a key)
        ├── OffsetRegression        (a write would move a consumed offset backwards)
        ├── ShardClosed             (the shard was closed; reopen it from the store)
        ├── StoreCorruption         (a stored value or database is not ours, or is damaged)
        └── StateDirLocked          (another worker holds the state directory)

The policies package keeps its own errors (e.g. its state format errors) in its own module.
"""

from __future__ import annotations


class LearnerError(Exception):
    """Base of every error the learner package raises on purpose."""


class RewardError(LearnerError):
    """Base of the reward engine's errors."""


class RewardExpressionError(RewardError, ValueError):
    """A compact reward expression did not parse.

    The message quotes the expression and points a caret at the offending column, so a
    pydantic validator that catches it (it is a ``ValueError``) reports it in full.
    """

    def __init__(self, expression: str, column: int, reason: str) -> None:
        self.expression = expression
        self.column = column
        self.reason = reason
        caret = " " * column + "^"
        super().__init__(
            f"invalid reward expression at column {column + 1}: {reason}\n  {expression}\n  {caret}"
        )


class InvalidReward(RewardError, ValueError):
    """A reward event carries a value or signal the engine cannot use (NaN, inf)."""


class StoreError(LearnerError):
    """Base of the posterior store's errors."""


class InvalidKey(StoreError, ValueError):
    """An id (tenant, workspace, domain, arm, topic) cannot be encoded in a store key."""


class OffsetRegression(StoreError):
    """A write would record a smaller consumed offset than the one already stored.

    Storing it would make the next restart re-apply updates already folded into the state.
    """


class ShardClosed(StoreError):
    """The shard was closed (e.g. its partition was revoked); reopen it from the store."""


class StoreCorruption(StoreError):
    """A stored value or database is damaged or was not written by this store.

    ``shard`` names the shard's directory and ``key`` the decoded key (``None`` when the
    database as a whole is at fault), so an operator knows exactly what to restore.
    """

    def __init__(self, shard: str, key: str | None, reason: str) -> None:
        self.shard = shard
        self.key = key
        self.reason = reason
        where = f"shard {shard}" if key is None else f"shard {shard}, key {key}"
        super().__init__(f"{where}: {reason}")


class StateDirLocked(StoreError):
    """Another live process holds the state directory (see :mod:`learner.statelock`).

    Two workers on one directory would both write its state; the second refuses to start.
    ``pid`` is the holder's process id as it wrote it (None if it could not be read).
    """

    def __init__(self, directory: str, pid: int | None) -> None:
        self.directory = directory
        self.pid = pid
        holder = f" (pid {pid})" if pid is not None else ""
        super().__init__(
            f"state directory {directory} is in use by another worker{holder}; stop it or choose another state_dir"
        )

    def __reduce__(self):
        return (type(self), (self.directory, self.pid))
