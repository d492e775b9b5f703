"""``banditstream serve`` under test: the real app on uvicorn in a thread, on a free loopback
port, deciding from a snapshot signed with real keys in a DirectoryStore, emitting to the
session's broker; and the API definition's schemas to check every body against."""

from __future__ import annotations

import contextlib
import json
import threading
import uuid
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import uvicorn

from banditstream.config import Settings
from banditstream.serve import OPENAPI_DIR, ServeApp
from learner.domain import DomainSettings
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.stores import DirectoryStore
from streams.settings import TopicSettings
from streams.topics import ensure_topics
from tests import join_helpers as H

KEY = "s3cr3t-key-for-tests"
OTHER_KEY = "another-teams-key"
ARMS = ["sports", "news", "entertainment"]
DOMAIN = "articles"
V1 = "/personalizer/v1.0"
PREVIEW_QS = "api-version=2022-09-01-preview"


def domain_settings() -> DomainSettings:
    return DomainSettings.model_validate({
        "policy": "lin_ucb", "params": {"alpha": 0.05, "eps0": 0.2, "seed": 1},
        "features": {"dimension": 16, "normalize": False}, "reward": {"window_s": 0.5},
    })  # fmt: skip


def trained_policy():
    """Learned: sports pays when user.age is high, news when it is low."""
    settings = domain_settings()
    policy, encoder = settings.make_policy(), settings.encoder()
    rng = np.random.default_rng(0)
    ages = rng.uniform(0, 1, 3000)
    X = np.stack([encoder.context_vector({"numeric": {"user.age": a}, "categorical": {}, "vector": []}) for a in ages])
    arms = [ARMS[i] for i in rng.integers(0, 3, len(ages))]
    truth = {"sports": lambda a: a, "news": lambda a: 1 - a, "entertainment": lambda a: 0.3}
    policy.update_batch(X, arms, [truth[arm](a) for arm, a in zip(arms, ages)])
    return policy


@dataclass
class Served:
    url: str
    app: ServeApp
    settings: Settings
    version: str  # the published snapshot's

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])


def serve_settings(kafka, topics, tmp_path: Path, root: bytes, **serve: Any) -> Settings:
    return Settings.model_validate(serve_config(kafka, topics, tmp_path, root, **serve))


def serve_config(kafka, topics, tmp_path: Path, root: bytes, **serve: Any) -> dict[str, Any]:
    """The config tree of :func:`serve_settings` (for a config file the CLI reads)."""
    (tmp_path / "root.json").write_bytes(root)
    return {
        "kafka": kafka.model_dump(), "topics": topics.model_dump(),
        "stores": {"state_dir": str(tmp_path / "state"), "snapshots": str(tmp_path / "snapshots")},
        "sdk": {"trusted_root": str(tmp_path / "root.json"), "cache_dir": str(tmp_path / "cache"), "refresh_interval_s": 0.5},
        "serve": {"keys": {"team-a": KEY, "team-b": OTHER_KEY}, "domain": DOMAIN, "max_body_bytes": 64 * 1024,
                  "routes": {"team-b": {"tenant": "acme", "domain": "other"}}, **serve},
        "domains": {DOMAIN: domain_settings().model_dump(mode="json")},
    }  # fmt: skip


def publish(tmp_path: Path, keys, root: bytes) -> str:
    store = DirectoryStore(tmp_path / "snapshots")
    publisher = Publisher(store, keys, root, domains={DOMAIN: domain_settings()},
                          config=PublisherConfig(guards=GuardConfig(min_samples=1)))  # fmt: skip
    return publisher.publish(DOMAIN, trained_policy()).version


def fresh_topics(prefix: str) -> TopicSettings:
    """Topics of their own for one test module (the session's broker is shared)."""
    suffix = uuid.uuid4().hex[:8]
    names = {kind: f"{prefix}-{suffix}.{kind}" for kind in ("decisions", "rewards", "updates", "posterior", "deadletter")}
    return TopicSettings(**names, partitions=2, update_partitions=2)


@contextlib.contextmanager
def serving(kafka, topics: TopicSettings, tmp_path: Path, keys, root: bytes, *, seed: int):
    """A published snapshot, and the service deciding from it on ``topics``, until the block ends."""
    ensure_topics(kafka, topics)
    version = publish(tmp_path, keys, root)
    settings = serve_settings(kafka, topics, tmp_path, root)
    server = ServerThread(ServeApp(settings, seed=seed)).start()
    try:
        yield Served(server.url, server.app, settings, version)
    finally:
        server.stop()


class ServerThread:
    """uvicorn serving ``app`` on a free loopback port until :meth:`stop`."""

    def __init__(self, app: ServeApp):
        self.port = H.free_port()
        config = uvicorn.Config(app.asgi(), host="127.0.0.1", port=self.port, log_level="warning", lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = f"http://127.0.0.1:{self.port}"
        self.app = app

    def start(self) -> "ServerThread":
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started or not self.app.ready:
            assert time.monotonic() < deadline and self.thread.is_alive(), "the service did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(30)


def call(method: str, url: str, body: Any = None, *, key: str | None = KEY, raw: bytes | None = None,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """One HTTP request with urllib: (status, headers, JSON body or bytes or None)."""
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Ocp-Apim-Subscription-Key", key)
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, got_headers, payload = response.status, dict(response.headers), response.read()
    except urllib.error.HTTPError as exc:
        status, got_headers, payload = exc.code, dict(exc.headers), exc.read()
    content_type = got_headers.get("content-type", got_headers.get("Content-Type", ""))
    if payload and content_type.startswith("application/json"):
        return status, got_headers, json.loads(payload)
    return status, got_headers, payload or None


class Schemas:
    """The API definition's schemas (the JSON shipped in the package), by operation."""

    def __init__(self) -> None:
        self.specs = {v: json.loads((OPENAPI_DIR / f"personalizer-{v}.json").read_text()) for v in ("v1.0", "2022-09-01-preview")}

    def schema(self, version: str, path: str, method: str, status: int) -> dict | None:
        spec = self.specs[version]
        responses = spec["paths"][path][method.lower()]["responses"]
        response = responses.get(str(status)) or responses.get("default")
        if response is None or "schema" not in response:
            return None
        return {**response["schema"], "definitions": spec["definitions"]}

    def validate(self, version: str, path: str, method: str, status: int, body: Any) -> None:
        schema = self.schema(version, path, method, status)
        if schema is None and status >= 400:  # an error the definition gives no body for: the API's error body
            schema = {"$ref": "#/definitions/ErrorResponse", "definitions": self.specs[version]["definitions"]}
        if schema is None:
            assert body is None, f"{method} {path} {status} has no body in the API definition, got {body!r}"
            return
        if schema.get("type") == "file":
            assert isinstance(body, bytes) and body
            return
        jsonschema.validate(body, schema)
