"""Builds the compiled extensions; the distribution's metadata is in pyproject.toml.

Both are optional at run time: without them the Python (numpy) code they speed up runs.
``-ffp-contract=off`` keeps the compiler from fusing a * b + c, so the decision step
computes with the roundings of the numpy code it replaces.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("streams._avrofast", ["streams/_avrofast.c"], extra_compile_args=["-O2"]),
        Extension("learner._fastscore", ["learner/_fastscore.c"], extra_compile_args=["-O2", "-ffp-contract=off"]),
    ]
)
