"""Typed errors and warnings of off-policy evaluation; callers catch them by meaning.

    EvaluationError
    └── InvalidInputError   (also a ValueError: arrays of the wrong shape, range or type)
    EvaluationWarning       (a UserWarning)
    └── LowESSWarning       (too few effective rows behind an estimate to trust it)

A CLI or a promotion gate turns :class:`InvalidInputError` into a refusal with the message as
it stands (it names the array, what was expected and what came), and treats
:class:`LowESSWarning` as "wait for more evidence", never as a verdict.
"""

from __future__ import annotations


class EvaluationError(Exception):
    """Base of every error the evaluation package raises on purpose."""


class InvalidInputError(EvaluationError, ValueError):
    """Arrays given to an estimator or a reward model do not fit together or are out of range.

    The message follows scikit-learn's habit: what was expected and what came, e.g.
    ``"pscore has 12 rows, but reward has 16"`` or ``"pscore must be in (0, 1]; row 3 is 0.0"``.
    """


class EvaluationWarning(UserWarning):
    """Base of the evaluation package's warnings."""


class LowESSWarning(EvaluationWarning):
    """The effective sample size of the importance weights is too small to trust the estimate.

    Raised through :func:`warnings.warn` (so ``warnings.simplefilter("error", LowESSWarning)``
    turns it into an exception) and kept, as text, in :attr:`Estimate.warnings`.
    """
