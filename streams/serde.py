"""Avro encoding and decoding of banditstream events, in both wire framings.

Two framings carry the same Avro binary body:

* **Confluent wire format** — ``0x00``, the schema id as 4 big-endian bytes, the body. The
  encoder registers our schema under a subject (``<topic>-value`` by default, as
  confluent-kafka's ``AvroSerializer`` does) once and caches the id; the decoder fetches the
  writer schema by id from the registry, once per id.
* **Avro single-object encoding** — ``0xC3 0x01``, the 8-byte little-endian CRC-64-AVRO
  fingerprint of the writer schema's Parsing Canonical Form, the body. No registry: the
  decoder resolves the fingerprint against the schemas this package ships, current and
  historical (``schemas/history``).

Decoding detects the framing from the first bytes and reads every writer version into the
current reader schema (Avro schema resolution: fields added since carry their defaults).

Values are the plain Avro types: ``timestamp-millis`` fields are ``int`` epoch
milliseconds on the way in and out (a ``datetime`` is also accepted on encode). confluent-kafka's
``AvroDeserializer`` returns ``datetime`` for them instead; compare through milliseconds.

Readers and writers are compiled per schema pair (:mod:`streams._avrocodec`): run in C by
the ``streams._avrofast`` extension, or as generated Python (about twice as fast as
fastavro's interpreting ones) where it is not built; fastavro stays the fallback for records
and schemas the compiled code does not take.

    >>> serde = AvroSerde("reward", framing="single_object")
    >>> event = {"event_id": "e1", "reward_id": "r1", "domain": "llm_routing",
    ...          "timestamp": 1_700_000_000_000, "signals": {"success": 1.0}}
    >>> payload = serde.encode(event)
    >>> payload[:2].hex()
    'c301'
    >>> decoded = serde.decode(payload)
    >>> decoded["signals"], decoded["tenant"], decoded["value"]
    ({'success': 1.0}, 'default', None)
"""

from __future__ import annotations

import functools
import json
import struct
from collections.abc import Callable, Collection, Iterable, Mapping
from io import BytesIO
from typing import Any, Literal

import fastavro

import schemas
from streams import _avrocodec
from streams.errors import (
    CorruptPayload,
    DecodeError,
    IncompatibleSchema,
    OversizePayload,
    RegistryError,
    TruncatedPayload,
    UnknownFingerprint,
    UnknownFraming,
    UnknownSchemaId,
)

__all__ = [
    "CONFLUENT_MAGIC",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "SINGLE_OBJECT_MAGIC",
    "AvroSerde",
    "Framing",
    "detect_framing",
]

Framing = Literal["confluent", "single_object"]
SubjectStrategy = Literal["topic", "record", "topic_record"]

CONFLUENT_MAGIC = b"\x00"
SINGLE_OBJECT_MAGIC = b"\xc3\x01"
_CONFLUENT_HEADER = 5  # magic + 4-byte schema id
_SINGLE_OBJECT_HEADER = 10  # magic + 8-byte fingerprint
DEFAULT_MAX_PAYLOAD_BYTES = 1_000_000
_REDO = object()  # marks a payload the C batch decoder left to the per-payload path

Reader = Callable[[bytes, int], tuple[Any, int]]


def detect_framing(data: bytes) -> Framing:
    """The framing of an encoded event, from its first bytes.

    Raises :class:`TruncatedPayload` for data too short to tell and :class:`UnknownFraming`
    for anything that is neither framing.
    """
    if not data:
        raise TruncatedPayload("payload", bytes(data), "empty; an event needs a framing header")
    if data[0] == 0:
        return "confluent"
    if data[0] == 0xC3:
        if len(data) < 2:
            raise TruncatedPayload("payload", bytes(data), "1 byte; the single-object marker is 0xC3 0x01")
        if data[1] == 0x01:
            return "single_object"
    raise UnknownFraming(
        "payload", bytes(data), "neither Confluent wire format (0x00) nor Avro single-object encoding (0xC3 0x01)"
    )


class AvroSerde:
    """Encode and decode one event type (``schemas.NAMES``) in either framing.

    Parameters:
        name: the schema, e.g. ``"decision"``; decoded events always come out in its current
            version.
        framing: what :meth:`encode` writes. :meth:`decode` reads both whatever this says.
        registry: a ``confluent_kafka.schema_registry.SchemaRegistryClient``; needed to
            encode in, and to decode, the Confluent framing.
        topic: the topic events are produced to; with ``subject_strategy="topic"`` the
            subject is ``<topic>-value`` (confluent-kafka's default).
        subject: the registry subject, overriding ``topic``/``subject_strategy``.
        subject_strategy: ``topic`` (``<topic>-value``), ``record`` (the record's full
            name) or ``topic_record`` (``<topic>-<full name>``).
        version: write this historical version of the schema instead of the current one
            (a producer pinned to an older contract; tests of evolution).
        max_payload_bytes: events larger than this are refused on encode and decode with
            :class:`OversizePayload`.
        auto_register: register the schema under the subject on first encode (else it must
            already be registered there).
        use_latest_version: write with the subject's latest registered schema and its id
            (Confluent's ``use.latest.version``; the records must fit it), not our own.
        skip: fields of the current schema that decoding leaves out: their bytes are stepped
            over, never built into Python values (the learner has no use for a shared model's
            candidate rows). Encoding is unchanged.
    """

    def __init__(
        self,
        name: str,
        *,
        framing: Framing = "confluent",
        registry: Any | None = None,
        topic: str | None = None,
        subject: str | None = None,
        subject_strategy: SubjectStrategy = "topic",
        version: int | None = None,
        max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
        auto_register: bool = True,
        use_latest_version: bool = False,
        skip: Collection[str] = (),
    ) -> None:
        if framing not in ("confluent", "single_object"):
            raise ValueError(f"framing must be 'confluent' or 'single_object', not {framing!r}")
        if max_payload_bytes < 1:
            raise ValueError(f"max_payload_bytes must be positive, not {max_payload_bytes}")
        self.name = name
        self.framing: Framing = framing
        self.registry = registry
        self.max_payload_bytes = max_payload_bytes
        self.auto_register = auto_register
        self.use_latest_version = use_latest_version
        self.version = version
        self._writer_json = schemas.load(name, version)
        self._reader_json = schemas.load(name)
        if skip:
            fields = {field["name"] for field in self._reader_json["fields"]}
            unknown = sorted(set(skip) - fields)
            if unknown:
                raise ValueError(f"skip names fields {name} does not have: {', '.join(unknown)}")
            kept = [field for field in self._reader_json["fields"] if field["name"] not in skip]
            self._reader_json = {**self._reader_json, "fields": kept}
        self.full_name = f"{self._reader_json.get('namespace', '')}.{self._reader_json['name']}".lstrip(".")
        self.subject = subject or _subject(topic, self.full_name, subject_strategy)
        if framing == "confluent" and registry is None:
            raise ValueError("the confluent framing needs a schema registry client (registry=...)")

        self._write_fast = _avrocodec.build_writer(self._writer_json)
        # fastavro keeps logical types, so it takes datetimes the generated writer refuses.
        self._write_fallback_schema = schemas.parsed(name, version)
        self._header: bytes | None = (
            SINGLE_OBJECT_MAGIC + schemas.fingerprint(name, version) if framing == "single_object" else None
        )
        # Decoder state: a compiled reader per framing header (magic + id or fingerprint).
        self._readers: dict[bytes, Reader] = {}
        self._fingerprints = _shipped_fingerprints()

    # -- encoding ----------------------------------------------------------------------

    def schema_id(self) -> int:
        """The registry id of the written schema under :attr:`subject` (registered if needed)."""
        header = self.header() if self.framing == "confluent" else self._confluent_header()
        return int.from_bytes(header[1:], "big")

    def header(self) -> bytes:
        """The framing bytes :meth:`encode` puts in front of every body."""
        if self._header is None:
            self._header = self._confluent_header()
        return self._header

    def encode(self, record: Mapping[str, Any]) -> bytes:
        """The framed Avro bytes of ``record``; :class:`OversizePayload` past the size limit."""
        header = self._header if self._header is not None else self.header()
        try:
            body = self._write_fast(record)
        except (KeyError, TypeError, AttributeError, ValueError, OverflowError, struct.error):
            body = self._write_slow(record)
        size = len(header) + len(body)
        if size > self.max_payload_bytes:
            raise OversizePayload(
                "payload", size, f"encoded bytes exceed the limit of {self.max_payload_bytes}"
            )
        return header + body

    def encode_batch(self, records: Iterable[Mapping[str, Any]]) -> list[bytes]:
        """:meth:`encode` for many records (raises on the first that fails)."""
        return [self.encode(record) for record in records]

    def _write_slow(self, record: Mapping[str, Any]) -> bytes:
        buf = BytesIO()
        fastavro.schemaless_writer(buf, self._write_fallback_schema, record)
        return buf.getvalue()

    def _confluent_header(self) -> bytes:
        if self.registry is None:
            raise ValueError("no schema registry client: cannot use the confluent framing")
        if self.subject is None:
            raise ValueError("no registry subject: pass topic= or subject= to AvroSerde")
        from confluent_kafka.schema_registry import Schema

        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            if self.use_latest_version:
                registered = self.registry.get_latest_version(self.subject)
                writer = json.loads(registered.schema.schema_str)
                self._write_fast = _avrocodec.build_writer(writer)
                self._write_fallback_schema = fastavro.parse_schema(writer)
                return CONFLUENT_MAGIC + int(registered.schema_id).to_bytes(4, "big")
            schema = Schema(schemas.schema_str(self.name, self.version), "AVRO")
            if self.auto_register:
                schema_id = self.registry.register_schema(self.subject, schema)
            else:
                schema_id = self.registry.lookup_schema(self.subject, schema).schema_id
        except SchemaRegistryError as exc:
            hint = " (register it, or set registry.auto_register_schemas)" if exc.http_status_code == 404 else ""
            raise RegistryError("subject", self.subject, f"the schema registry answered {exc.http_status_code}: "
                                                         f"{exc.error_message}{hint}") from None
        except Exception as exc:  # the client's transport errors (httpx's) share no base with OSError
            raise RegistryError("subject", self.subject, f"the schema registry could not be reached: {exc}") from None
        return CONFLUENT_MAGIC + int(schema_id).to_bytes(4, "big")

    # -- decoding ----------------------------------------------------------------------

    def decode(self, data: bytes) -> dict[str, Any]:
        """The event in ``data`` (either framing) as a dict in the current schema.

        Raises a :class:`DecodeError` subclass for bytes that are not such an event. A
        registry that cannot be reached raises its own error (a retryable condition, not a
        bad record).
        """
        if type(data) is not bytes:
            data = bytes(data)
        size = len(data)
        if size > self.max_payload_bytes:
            raise OversizePayload("payload", size, f"bytes exceed the limit of {self.max_payload_bytes}")
        first = data[0] if size else -1
        if first == 0:
            header = data[:_CONFLUENT_HEADER]
        elif first == 0xC3 and size >= 2 and data[1] == 0x01:
            header = data[:_SINGLE_OBJECT_HEADER]
        else:
            detect_framing(data)  # raises the precise error
            raise AssertionError("unreachable")  # pragma: no cover
        read = self._readers.get(header)
        if read is None:
            read = self._reader_for(header, data)
        start = len(header)
        try:
            record, _ = read(data, start)
        except (IndexError, struct.error):
            raise TruncatedPayload(
                "payload", data, f"{size} bytes end before the {self.full_name} record does"
            ) from None
        except UnicodeDecodeError as exc:
            raise CorruptPayload("payload", data, f"invalid UTF-8 in a string at byte {start + exc.start}") from None
        except _avrocodec.CorruptData as exc:
            raise CorruptPayload("payload", data, str(exc)) from None
        except _avrocodec.Incompatible as exc:
            raise IncompatibleSchema("payload", data, f"cannot be read as {self.full_name}: {exc}") from None
        return record

    def decode_batch(self, payloads: Iterable[bytes]) -> list[dict[str, Any] | DecodeError]:
        """Decode many payloads; a payload that fails yields its :class:`DecodeError` in place.

        A worker dead-letters the errors and keeps the rest, in order. Readers are compiled
        once per writer schema and looked up by the framing header, and bodies are read in
        place from the payload (no copy, no stream object), so each record costs its body.
        With the C reader, every payload framed like the first is decoded in one call; the
        others, and any that fail, go through :meth:`decode` for their value or typed error.
        """
        payloads = payloads if isinstance(payloads, list) else list(payloads)
        decode = self.decode
        batch = self._batch_decoder(payloads[0]) if payloads else None
        if batch is not None:
            out, redo = batch[0](payloads, batch[1], self.max_payload_bytes, _REDO)
            if redo:
                for i, result in enumerate(out):
                    if result is _REDO:
                        try:
                            out[i] = decode(payloads[i])
                        except DecodeError as err:
                            out[i] = err
            return out
        out: list[dict[str, Any] | DecodeError] = []
        append = out.append
        for payload in payloads:
            try:
                append(decode(payload))
            except DecodeError as err:
                append(err)
        return out

    def _batch_decoder(self, first: Any) -> tuple[_avrocodec.BatchDecoder, bytes] | None:
        """The C batch decoder for payloads framed like ``first``, and that framing header."""
        if type(first) is not bytes or not first:
            return None
        if first[0] == 0:
            header = first[:_CONFLUENT_HEADER]
        elif first[0] == 0xC3 and first[1:2] == b"\x01":
            header = first[:_SINGLE_OBJECT_HEADER]
        else:
            return None
        read = self._readers.get(header)
        if read is None:
            try:
                read = self._reader_for(header, first)
            except DecodeError:  # the per-payload path reports it in place
                return None
        batch = _avrocodec.batch_decoder(read)
        return None if batch is None else (batch, header)

    def _reader_for(self, header: bytes, data: bytes) -> Reader:
        if header[0] == 0:
            if len(header) < _CONFLUENT_HEADER:
                raise TruncatedPayload(
                    "payload", data, f"{len(data)} bytes; the Confluent header is {_CONFLUENT_HEADER}"
                )
            schema_id = int.from_bytes(header[1:], "big")
            writer = self._registry_schema(schema_id)
            origin = f"registry schema id {schema_id}"
        else:
            if len(header) < _SINGLE_OBJECT_HEADER:
                raise TruncatedPayload(
                    "payload", data, f"{len(data)} bytes; the single-object header is {_SINGLE_OBJECT_HEADER}"
                )
            fingerprint = header[2:]
            known = self._fingerprints.get(fingerprint)
            if known is None:
                raise UnknownFingerprint(
                    "payload", fingerprint.hex(), "matches no schema shipped with banditstream (CRC-64-AVRO, little-endian)"
                )
            writer = schemas.load(*known)
            origin = f"{known[0]} v{known[1] or 'current'} (fingerprint {fingerprint.hex()})"
        read = self._compile(writer, origin)
        self._readers[bytes(header)] = read
        return read

    def _registry_schema(self, schema_id: int) -> Any:
        if self.registry is None:
            raise UnknownSchemaId("schema_id", schema_id, "no schema registry is configured to resolve it")
        from confluent_kafka.schema_registry.error import SchemaRegistryError

        try:
            registered = self.registry.get_schema(schema_id)
        except SchemaRegistryError as exc:
            if exc.http_status_code == 404:
                raise UnknownSchemaId("schema_id", schema_id, "the schema registry does not know it") from None
            raise
        if (registered.schema_type or "AVRO") != "AVRO":
            raise IncompatibleSchema("schema_id", schema_id, f"is a {registered.schema_type} schema, not Avro")
        return json.loads(registered.schema_str)

    def _compile(self, writer: Any, origin: str) -> Reader:
        try:
            return _avrocodec.build_reader(writer, self._reader_json)
        except _avrocodec.Incompatible as exc:
            raise IncompatibleSchema("writer_schema", origin, f"cannot be read as {self.full_name}: {exc}") from None
        except _avrocodec.Unsupported:
            return _fastavro_reader(writer, self._reader_json)


def _subject(topic: str | None, full_name: str, strategy: SubjectStrategy) -> str | None:
    if strategy == "record":
        return full_name
    if topic is None:
        return None
    if strategy == "topic":
        return f"{topic}-value"
    if strategy == "topic_record":
        return f"{topic}-{full_name}"
    raise ValueError(f"subject_strategy must be topic, record or topic_record, not {strategy!r}")


def _fastavro_reader(writer: Any, reader: Any) -> Reader:
    """fastavro with the same conventions (raw logical types), for schemas codegen skips."""
    wparsed = fastavro.parse_schema(_avrocodec.strip_logical_types(writer))
    rparsed = fastavro.parse_schema(_avrocodec.strip_logical_types(reader))
    if fastavro.schema.to_parsing_canonical_form(wparsed) == fastavro.schema.to_parsing_canonical_form(rparsed):
        rparsed = None

    def read(buf: bytes, pos: int) -> tuple[Any, int]:
        stream = BytesIO(buf)
        stream.seek(pos)
        try:
            record = fastavro.schemaless_reader(stream, wparsed, rparsed)
        except EOFError as exc:
            raise IndexError(str(exc)) from None
        except fastavro.read.SchemaResolutionError as exc:
            raise _avrocodec.CorruptData(str(exc)) from None
        return record, stream.tell()

    return read


@functools.cache
def _shipped_fingerprints() -> Mapping[bytes, tuple[str, int | None]]:
    """Fingerprint -> (schema name, version or None for current) for every shipped schema."""
    table: dict[bytes, tuple[str, int | None]] = {}
    for name in schemas.NAMES:
        table[schemas.fingerprint(name)] = (name, None)
        for version in schemas.history(name):
            table.setdefault(schemas.fingerprint(name, version), (name, version))
    return table
