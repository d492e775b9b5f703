"""Builds the compiled Avro codec; the distribution's metadata is in pyproject.toml."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("streams._avrofast", ["streams/_avrofast.c"], extra_compile_args=["-O2"])])
