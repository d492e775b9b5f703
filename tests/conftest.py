"""Shared fixtures: the real local stack (Tansu broker, SeaweedFS S3) for the session.

A test that needs a server asks for ``kafka`` or ``s3``; the stack starts once per session
and stops at the end. If it cannot start, the fixture fails loudly (no skip).
"""

from __future__ import annotations

import os
import uuid

import pytest
from threadpoolctl import threadpool_limits

from banditstream.devstack import LocalStack, StackInfo
from publisher.repository import create_root
from publisher.signing import KeyRing
from streams.settings import KafkaSettings, TopicSettings

# One BLAS thread, in this process and in every process a test starts (examples, the demo, the
# SDK in scripts; the workers already limit themselves, see cli._one_blas_thread): the suite
# runs the broker, S3 and several Python processes on two shared cores, where multi-threaded
# BLAS stalls on the many small products of deciding and learning (measured: the RAG
# example's decisions took 3.4 ms each instead of ~0.1 ms, the example 86 s instead of 56 s).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
threadpool_limits(int(os.environ["OPENBLAS_NUM_THREADS"]))


@pytest.fixture(scope="session")
def stack(tmp_path_factory) -> StackInfo:
    """Both servers, started once for the whole session."""
    local = LocalStack(tmp_path_factory.mktemp("stack"))
    info = local.up()  # raises StackError with the log's location if a server fails
    yield info
    local.down()


@pytest.fixture(scope="session")
def kafka(stack) -> KafkaSettings:
    """Settings for the session's broker, with its compatibility profile."""
    return KafkaSettings(bootstrap_servers=stack.kafka_bootstrap, profile=stack.kafka_profile)


@pytest.fixture
def topics() -> TopicSettings:
    """Fresh topic names per test, so tests never see each other's records."""
    suffix = uuid.uuid4().hex[:8]
    return TopicSettings(
        decisions=f"t-{suffix}.decisions",
        rewards=f"t-{suffix}.rewards",
        updates=f"t-{suffix}.updates",
        posterior=f"t-{suffix}.posterior",
        deadletter=f"t-{suffix}.deadletter",
        partitions=4,
        update_partitions=4,
    )


@pytest.fixture(scope="session")
def s3(stack) -> dict:
    """boto3 client keyword arguments for the session's S3 server."""
    return {
        "endpoint_url": stack.s3_endpoint,
        "aws_access_key_id": stack.s3_access_key,
        "aws_secret_access_key": stack.s3_secret_key,
        "region_name": stack.s3_region,
    }


@pytest.fixture(scope="module")
def keys() -> KeyRing:
    """Fresh Ed25519 keys for every TUF role."""
    return KeyRing.generate()


@pytest.fixture(scope="module")
def root(keys) -> bytes:
    """The signed root.json those keys make."""
    return create_root(keys)
