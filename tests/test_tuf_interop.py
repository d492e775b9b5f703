"""Any TUF client can verify our repositories: python-tuf's unmodified ngclient Updater
refreshes and downloads a snapshot over real HTTP, and refuses a tampered one."""

from __future__ import annotations

import functools
import http.server
import threading

import numpy as np
import pytest
from tuf.api import exceptions as tuf_exceptions
from tuf.api.metadata import Metadata, Root
from tuf.ngclient import Updater

from learner.domain import DomainSettings
from publisher.guards import GuardConfig
from publisher.publish import Publisher, PublisherConfig
from publisher.pull import SnapshotClient
from publisher.repository import create_root
from publisher.signing import KeyRing
from publisher.snapshot import Snapshot
from publisher.stores import DirectoryStore, HttpStore

SETTINGS = DomainSettings(policy="lin_ts", features={"dimension": 4})


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep test output clean
        pass


@pytest.fixture
def served(tmp_path):
    """A published repository in a directory served over HTTP on 127.0.0.1."""
    keys = KeyRing.generate()
    root = create_root(keys)
    store = DirectoryStore(tmp_path / "www")
    publisher = Publisher(store, keys, root, domains={"route": SETTINGS}, config=PublisherConfig(guards=GuardConfig(min_samples=1)))
    policy = SETTINGS.make_policy()
    rng = np.random.default_rng(0)
    for _ in range(2):
        policy.update_batch(rng.standard_normal((40, 4)), ["x", "y"] * 20, rng.random(40))
        result = publisher.publish("route", policy, source_offsets=[("bandit.updates", 0, 40)])
    handler = functools.partial(_QuietHandler, directory=str(store.root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield {"url": f"http://127.0.0.1:{server.server_port}/default/main/route/", "root": root, "store": store, "result": result}
    server.shutdown()
    server.server_close()


def updater(served, tmp_path) -> Updater:
    return Updater(
        metadata_dir=str(tmp_path / "tuf-metadata"),
        metadata_base_url=served["url"] + "metadata/",
        target_dir=str(tmp_path / "tuf-targets"),
        target_base_url=served["url"] + "targets/",
        bootstrap=served["root"],
    )


def test_unmodified_tuf_ngclient_updater_refreshes_and_downloads_a_target_over_http(served, tmp_path):
    (tmp_path / "tuf-metadata").mkdir()
    client = updater(served, tmp_path)
    client.refresh()
    info = client.get_targetinfo("snapshot-1.0.1.avro.zst")
    assert info is not None
    path = client.download_target(info)

    with open(path, "rb") as handle:
        snapshot = Snapshot.from_bytes(handle.read())
    assert snapshot.version == "1.0.1" and snapshot.samples == 80
    custom = info.custom
    for field in ("version", "git_commit", "dimension", "arms", "samples", "source_offsets", "created_at", "channels"):
        assert field in custom, field
    assert custom["source_offsets"] == [{"topic": "bandit.updates", "partition": 0, "offset": 40}]
    assert client.find_cached_target(info) == path


def test_tuf_repository_uses_consistent_snapshots_and_hash_prefixed_targets(served):
    store, result = served["store"], served["result"]
    names = {i.key.split("/", 3)[3] for i in store.list("default/main/route/")}
    assert {"metadata/1.root.json", "metadata/timestamp.json", "metadata/2.snapshot.json", "metadata/2.targets.json"} <= names
    assert f"targets/{result.entry.sha256}.snapshot-1.0.1.avro.zst" in names
    root = Metadata[Root].from_bytes(store.get("default/main/route/metadata/1.root.json"))
    assert root.signed.consistent_snapshot
    assert {role: r.threshold for role, r in root.signed.roles.items()} == dict.fromkeys(("root", "targets", "snapshot", "timestamp"), 1)


def test_tuf_ngclient_updater_refuses_a_tampered_target_over_http(served, tmp_path):
    blob = served["store"].root / "default/main/route" / served["result"].entry.blob_key
    data = bytearray(blob.read_bytes())
    data[100] ^= 0xFF
    blob.write_bytes(bytes(data))
    (tmp_path / "tuf-metadata").mkdir()
    client = updater(served, tmp_path)
    info = client.get_targetinfo("snapshot-1.0.1.avro.zst")
    with pytest.raises(tuf_exceptions.LengthOrHashMismatchError):
        client.download_target(info)


def test_our_pull_client_reads_the_same_repository_over_http(served, tmp_path):
    client = SnapshotClient(HttpStore(served["url"].rsplit("default/", 1)[0]), tmp_path / "cache", served["root"], domain="route")
    assert client.refresh().version == "1.0.1"
