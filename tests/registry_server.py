"""An in-process Confluent Schema Registry for tests.

It speaks enough of the registry's REST API for confluent-kafka's ``SchemaRegistryClient``,
``AvroSerializer`` (``auto.register.schemas`` on or off, ``use.latest.version``) and
``AvroDeserializer``, with the registry's paths, query parameters and error bodies::

    POST   /subjects/{subject}/versions      register            ?normalize
    POST   /subjects/{subject}               look a schema up    ?normalize ?deleted
    GET    /subjects                         list subjects       ?subjectPrefix ?deleted ?deleted_only ?offset ?limit
    GET    /subjects/{subject}/versions      list versions       ?deleted ?deleted_only ?offset ?limit
    GET    /subjects/{subject}/versions/{v}  one version, v = N, latest or -1           ?deleted
    DELETE /subjects/{subject}               soft delete; ?permanent=true after a soft delete
    GET    /schemas/ids/{id}                 schema by id (?subject and ?format accepted, ignored)
    GET    /associations/resources/{namespace}/{topic}   always [] (no associations)

The serdes' default subject-name strategy (2.16) first asks for the topic's associations and,
finding none, falls back to ``{topic}-key`` / ``{topic}-value``.

Ids are global, as in Confluent's registry: the same schema (whitespace aside; with
``normalize=true`` also the order of JSON attributes) gets the same id under every subject,
and registering it again under a subject returns the existing id without a new version.
Avro schemas are checked with ``fastavro.parse_schema`` and JSON schemas for being JSON;
other types, schema references, compatibility levels and guids are not implemented.

Errors carry the registry's body, e.g. 404 ``{"error_code": 40401, "message": "Subject
'x' not found."}``: 40401 subject, 40402 version and 40403 schema not found, 40404 subject
already soft-deleted, 40405 permanent delete before a soft one, 42201 invalid schema,
42202 invalid version, 401 missing or wrong credentials.

Every request is recorded in :attr:`RegistryServer.requests`, credentials included.
:func:`make_self_signed_cert` makes a CA and a server certificate with the ``cryptography``
package (installed with confluent-kafka's schema registry client, through authlib); it runs
no ``openssl`` command.

    >>> from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    >>> with RegistryServer(basic_auth=("user", "secret")) as server:
    ...     client = SchemaRegistryClient({"url": server.url, "basic.auth.user.info": "user:secret"})
    ...     client.register_schema("orders-value", Schema('"string"', "AVRO"))
    1
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import json
import ssl
import threading
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple
from urllib.parse import parse_qs, unquote, urlsplit

import fastavro

from tests.loopback_http import serve_in_thread, shut_down


class Request(NamedTuple):
    """One request as the server saw it; ``path`` includes the query string."""

    method: str
    path: str
    authorization: str | None
    headers: dict[str, str]


class RegistryError(Exception):
    """An error response: HTTP status, the registry's error code and its message."""

    def __init__(self, status: int, code: int, message: str):
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _subject_not_found(subject: str) -> RegistryError:
    return RegistryError(404, 40401, f"Subject '{subject}' not found.")


@dataclass
class _Version:
    number: int
    schema_id: int
    deleted: bool = False


class _Store:
    """The registry's state and rules, without HTTP; callers hold the lock."""

    def __init__(self):
        self.schemas: list[dict[str, str]] = []  # id N is schemas[N - 1]
        self.ids: dict[tuple[str, str], int] = {}  # (schema type, comparison key) -> id
        self.subjects: dict[str, list[_Version]] = {}

    def register(self, subject: str, body: Any, normalize: bool) -> dict:
        schema_id = self._id_for(body, normalize, create=True)
        versions = self.subjects.setdefault(subject, [])
        if not any(v.schema_id == schema_id and not v.deleted for v in versions):
            versions.append(_Version(max((v.number for v in versions), default=0) + 1, schema_id))
        return {"id": schema_id}

    def lookup(self, subject: str, body: Any, normalize: bool, deleted: bool) -> dict:
        versions = self._visible(subject, deleted, deleted_only=False)
        schema_id = self._id_for(body, normalize, create=False)
        matches = [v for v in versions if v.schema_id == schema_id]
        if not matches:
            raise RegistryError(404, 40403, "Schema not found")
        return self._describe(subject, matches[-1])

    def schema(self, schema_id: int) -> dict:
        if not 1 <= schema_id <= len(self.schemas):
            raise RegistryError(404, 40403, f"Schema {schema_id} not found")
        return dict(self.schemas[schema_id - 1])

    def subject_names(self, prefix: str, deleted: bool, deleted_only: bool) -> list[str]:
        return sorted(
            name for name, versions in self.subjects.items()
            if name.startswith(prefix) and _select(versions, deleted, deleted_only)
        )  # fmt: skip

    def version_numbers(self, subject: str, deleted: bool, deleted_only: bool) -> list[int]:
        return [v.number for v in self._visible(subject, deleted, deleted_only)]

    def version(self, subject: str, version: str, deleted: bool) -> dict:
        versions = self._visible(subject, deleted, deleted_only=False)
        if version in ("latest", "-1"):
            return self._describe(subject, versions[-1])
        if not version.isdigit() or not 1 <= int(version) <= 2**31 - 1:
            raise RegistryError(422, 42202, f"The specified version '{version}' is not a valid version id. "
                                            'Allowed values are between [1, 2^31-1] and the string "latest"')
        for v in versions:
            if v.number == int(version):
                return self._describe(subject, v)
        raise RegistryError(404, 40402, f"Version {version} not found.")

    def delete_subject(self, subject: str, permanent: bool) -> list[int]:
        versions = self.subjects.get(subject)
        if not versions:
            raise _subject_not_found(subject)
        live = [v for v in versions if not v.deleted]
        if permanent:
            if live:
                raise RegistryError(404, 40405, f"Subject '{subject}' was not deleted first before being permanently deleted")
            del self.subjects[subject]
            return [v.number for v in versions]
        if not live:
            raise RegistryError(404, 40404, f"Subject '{subject}' was soft deleted.Set permanent=true to delete permanently")
        for v in live:
            v.deleted = True
        return [v.number for v in live]

    def _visible(self, subject: str, deleted: bool, deleted_only: bool) -> list[_Version]:
        versions = _select(self.subjects.get(subject, []), deleted, deleted_only)
        if not versions:
            raise _subject_not_found(subject)
        return versions

    def _describe(self, subject: str, version: _Version) -> dict:
        return {"subject": subject, "version": version.number, "id": version.schema_id, **self.schema(version.schema_id)}

    def _id_for(self, body: Any, normalize: bool, *, create: bool) -> int:
        """The id of the schema in a request body; a new one if ``create``, else 40403."""
        schema_type, text, key = _parse(body, normalize)
        schema_id = self.ids.get((schema_type, key))
        if schema_id is None:
            if not create:
                raise RegistryError(404, 40403, "Schema not found")
            self.schemas.append({"schema": text} if schema_type == "AVRO" else {"schema": text, "schemaType": schema_type})
            schema_id = self.ids[(schema_type, key)] = len(self.schemas)
        return schema_id


def _select(versions: list[_Version], deleted: bool, deleted_only: bool) -> list[_Version]:
    if deleted_only:
        return [v for v in versions if v.deleted]
    return [v for v in versions if deleted or not v.deleted]


def _parse(body: Any, normalize: bool) -> tuple[str, str, str]:
    """(schema type, text, comparison key) of a request body, or 42201 if it is not a schema."""
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(422, 42201, "Invalid schema: the request has no schema string")
    text, schema_type = body["schema"], body.get("schemaType") or "AVRO"
    if schema_type not in ("AVRO", "JSON"):
        raise RegistryError(422, 42201, f"Invalid schema: this test registry knows AVRO and JSON, not {schema_type}")
    try:
        parsed = json.loads(text)
        if schema_type == "AVRO":
            fastavro.parse_schema(parsed)
    except Exception as exc:  # fastavro raises several unrelated types for bad schemas
        raise RegistryError(422, 42201, f"Invalid schema: {exc}") from None
    return schema_type, text, json.dumps(parsed, separators=(",", ":"), sort_keys=normalize)


def _page(items: list, query: dict[str, str]) -> list:
    offset, limit = int(query.get("offset", 0)), int(query.get("limit", -1))
    return items[offset:] if limit < 0 else items[offset:offset + limit]


class RegistryServer:
    """A schema registry on ``127.0.0.1`` at a free port, served from a background thread.

    Args:
        basic_auth: ``(user, password)``; requests must then carry that Basic credential.
        bearer_token: requests must then carry ``Authorization: Bearer <token>``.
            With both set, either credential is accepted.
        tls: ``(certfile, keyfile)`` to serve HTTPS instead of HTTP.
    """

    def __init__(self, *, basic_auth: tuple[str, str] | None = None, bearer_token: str | None = None,
                 tls: tuple[str, str] | None = None):
        self.requests: list[Request] = []
        self._accepted = set()
        if basic_auth is not None:
            self._accepted.add("Basic " + base64.b64encode(":".join(basic_auth).encode()).decode())
        if bearer_token is not None:
            self._accepted.add(f"Bearer {bearer_token}")
        self._tls = tls
        self._store = _Store()
        self._lock = threading.Lock()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (``https://`` with ``tls``); the server must be started."""
        if self._httpd is None:
            raise RuntimeError("the registry server is not started")
        scheme = "https" if self._tls else "http"
        return f"{scheme}://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> "RegistryServer":
        httpd = _HTTPServer(("127.0.0.1", 0), _Handler)
        httpd.registry = self
        if self._tls is not None:
            httpd.ssl_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            httpd.ssl_context.load_cert_chain(*self._tls)
        self._httpd = httpd
        self._thread = serve_in_thread(httpd, "registry-server")
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        shut_down(self._httpd, self._thread)
        self._httpd = self._thread = None

    def __enter__(self) -> "RegistryServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def handle(self, method: str, target: str, headers: Message, raw_body: bytes) -> tuple[int, Any]:
        """The (status, JSON body) answer to one request."""
        authorization = headers.get("Authorization")  # a Message looks names up case-insensitively
        self.requests.append(Request(method, target, authorization, dict(headers)))
        try:
            if self._accepted and authorization not in self._accepted:
                raise RegistryError(401, 401, "Unauthorized")
            try:
                body = json.loads(raw_body) if raw_body else None
            except ValueError:
                raise RegistryError(400, 400, "The request body is not JSON") from None
            url = urlsplit(target)
            parts = [unquote(part) for part in url.path.strip("/").split("/")]
            query = {name: values[-1] for name, values in parse_qs(url.query).items()}
            with self._lock:
                return 200, self._route(method, parts, query, body)
        except RegistryError as error:
            return error.status, {"error_code": error.code, "message": error.message}

    def _route(self, method: str, parts: list[str], query: dict[str, str], body: Any) -> Any:
        store = self._store

        def flag(name: str) -> bool:
            return query.get(name, "false").lower() == "true"  # the client sends "True"/"False"

        match method, parts:
            case "POST", ["subjects", subject, "versions"]:
                return store.register(subject, body, flag("normalize"))
            case "POST", ["subjects", subject]:
                return store.lookup(subject, body, flag("normalize"), flag("deleted"))
            case "GET", ["subjects"]:
                return _page(store.subject_names(query.get("subjectPrefix", ""), flag("deleted"), flag("deleted_only")), query)
            case "GET", ["subjects", subject, "versions"]:
                return _page(store.version_numbers(subject, flag("deleted"), flag("deleted_only")), query)
            case "GET", ["subjects", subject, "versions", version]:
                return store.version(subject, version, flag("deleted"))
            case "DELETE", ["subjects", subject]:
                return store.delete_subject(subject, flag("permanent"))
            case "GET", ["schemas", "ids", schema_id] if schema_id.isdigit():
                return store.schema(int(schema_id))
            case "GET", ["associations", "resources", _, _]:
                return []
        raise RegistryError(404, 404, "HTTP 404 Not Found")


class _HTTPServer(ThreadingHTTPServer):
    registry: RegistryServer
    ssl_context: ssl.SSLContext | None = None

    def finish_request(self, request, client_address) -> None:
        if self.ssl_context is None:
            return super().finish_request(request, client_address)
        # the handshake runs here, in the connection's thread, so a slow client blocks no other
        try:
            request = self.ssl_context.wrap_socket(request, server_side=True)
        except OSError:  # e.g. the client rejected the certificate
            return
        with request:
            super().finish_request(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def _serve(self) -> None:
        # read the whole body first, even for a 401: closing on unread data resets the
        # connection and the client would retry instead of reading the answer
        raw_body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, payload = self.server.registry.handle(self.command, self.path, self.headers, raw_body)
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_DELETE = _serve

    def log_message(self, format: str, *args) -> None:
        """Silent: tests read :attr:`RegistryServer.requests` instead."""


def make_self_signed_cert(directory: str | Path) -> tuple[str, str, str]:
    """A test CA and a server certificate it signed for ``127.0.0.1`` and ``localhost``.

    Writes ``ca.pem``, ``server.pem`` and ``server.key`` (unencrypted) into ``directory``
    and returns their paths as strings (``SchemaRegistryClient`` ignores an
    ``ssl.ca.location`` that is not a ``str``).
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "registry-server test CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                     crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name).public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost"),
                                                    x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    paths = directory / "ca.pem", directory / "server.pem", directory / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    return str(paths[0]), str(paths[1]), str(paths[2])
