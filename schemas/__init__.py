"""The event contracts: Avro schemas shipped as package data, and a tiny loader.

Every schema lives in one namespace, ``io.banditstream.v1``; evolution within it must stay
backward compatible (new fields carry defaults), so a reader with the current schema reads
everything written with an older one. Superseded versions are kept in ``history/`` as
``NAME.vN.avsc`` so compatibility is tested against the real old contract.

    >>> import schemas
    >>> schemas.load("decision")["name"]
    'DecisionEvent'
    >>> schemas.NAMES
    ('decision', 'reward', 'update', 'posterior', 'deadletter', 'snapshot')
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

import fastavro
import fastavro.schema

NAMESPACE = "io.banditstream.v1"

#: Schema names in the order data flows through the system.
NAMES = ("decision", "reward", "update", "posterior", "deadletter", "snapshot")


class UnknownSchema(KeyError):
    """No schema (or no such historical version) ships with this package."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0])


def _resource_name(name: str, version: int | None) -> str:
    if version is None:
        return f"{name}.avsc"
    return f"history/{name}.v{version}.avsc"


@functools.cache
def schema_str(name: str, version: int | None = None) -> str:
    """The schema's JSON text exactly as shipped (what a registry stores)."""
    if name not in NAMES:
        raise UnknownSchema(f"unknown schema {name!r}; known: {', '.join(NAMES)}")
    path = resources.files(__name__).joinpath(_resource_name(name, version))
    if not path.is_file():
        raise UnknownSchema(f"schema {name!r} has no shipped version {version}")
    return path.read_text(encoding="utf-8")


def load(name: str, version: int | None = None) -> dict[str, Any]:
    """The schema as a JSON object (a fresh copy each call: callers may mutate it)."""
    return json.loads(schema_str(name, version))


@functools.cache
def parsed(name: str, version: int | None = None) -> dict[str, Any]:
    """The schema parsed by fastavro, ready for ``schemaless_writer``/``schemaless_reader``."""
    return fastavro.parse_schema(load(name, version))


@functools.cache
def fingerprint(name: str, version: int | None = None) -> bytes:
    """CRC-64-AVRO fingerprint of the schema's Parsing Canonical Form, as 8 bytes.

    This is the fingerprint the Avro single-object encoding puts after ``0xC3 0x01``
    (little-endian), which lets decoders resolve a schema without a registry.
    """
    canonical = fastavro.schema.to_parsing_canonical_form(parsed(name, version))
    hex_digest = fastavro.schema.fingerprint(canonical, "CRC-64-AVRO")
    return bytes.fromhex(hex_digest)


def history(name: str) -> list[int]:
    """The historical versions of a schema that ship in ``history/``, oldest first."""
    schema_str(name)  # validates the name
    folder = resources.files(__name__).joinpath("history")
    prefix = f"{name}.v"
    versions = [
        int(entry.name[len(prefix) : -len(".avsc")])
        for entry in folder.iterdir()
        if entry.name.startswith(prefix) and entry.name.endswith(".avsc")
    ]
    return sorted(versions)
