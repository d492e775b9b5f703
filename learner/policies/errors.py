"""Typed errors of the policies package; callers catch them by meaning.

    PolicyError
    ├── StateFormatError    (also a ValueError: a state blob is foreign, corrupt or of another layout)
    ├── ScoringOnlyError    (also a RuntimeError: a scoring view was asked to learn)
    └── NumericalError      (also an ArithmeticError: a precision matrix is no longer positive definite)
"""

from __future__ import annotations


class PolicyError(Exception):
    """Base of every error the policies raise on purpose."""


class StateFormatError(PolicyError, ValueError):
    """A state blob is not a banditstream policy state, is damaged, or does not fit this policy.

    Raised for a wrong magic, another format major version, a checksum mismatch, a header that
    does not parse, arrays whose sizes do not add up, non-finite values, or a blob written by
    another policy, another dimension or for another arm. A store wraps it with the shard and key.
    """


class ScoringOnlyError(PolicyError, RuntimeError):
    """A policy built from a scoring view (posterior means and factors only) cannot learn."""


class NumericalError(PolicyError, ArithmeticError):
    """An arm's precision matrix is not positive definite, so it cannot be factorised.

    Updates with non-negative weights over a positive prior keep it positive definite; this
    signals state loaded from elsewhere that was already broken, or a numerical collapse.
    """
