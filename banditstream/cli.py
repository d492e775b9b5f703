"""The ``banditstream`` command: a thin layer over library calls.

Every command loads the one configuration tree (``--config`` or ``$BANDITSTREAM_CONFIG``,
then ``BANDITSTREAM_*`` environment overrides). Expected failures (bad config, a server
that does not answer, a broken topic layout, a state directory another worker holds) print
one line and exit 2; nothing prints a traceback unless ``--verbose`` is given.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from banditstream.config import ConfigError, Settings, load_settings
from banditstream.demo import DemoError
from banditstream.devstack import LocalStack, StackError
from learner.errors import StateDirLocked, StoreError
from learner.evaluation.errors import EvaluationError
from streams.errors import BanditstreamError
from streams.topics import TopicError, ensure_topics
from streams.validation import Validator

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Self-hosted contextual-bandit learning loop.")
dev_app = typer.Typer(no_args_is_help=True, help="The embedded local stack (Tansu broker, SeaweedFS S3).")
topics_app = typer.Typer(no_args_is_help=True, help="The project's Kafka topics.")
config_app = typer.Typer(no_args_is_help=True, help="The configuration tree.")
app.add_typer(dev_app, name="dev")
app.add_typer(topics_app, name="topics")
app.add_typer(config_app, name="config")
keys_app = typer.Typer(no_args_is_help=True, help="Ed25519 signing keys and the trusted root.")
snapshot_app = typer.Typer(no_args_is_help=True, help="Signed, versioned snapshots in the repository.")
app.add_typer(keys_app, name="keys")
app.add_typer(snapshot_app, name="snapshot")

console = Console()
err_console = Console(stderr=True)

DEFAULT_DEV_DIR = ".banditstream/dev"
EXPECTED_ERRORS = (ConfigError, StackError, TopicError, BanditstreamError, DemoError, StateDirLocked, StoreError, EvaluationError)
DEMO_DOMAINS = ("llm_routing", "support_templates")
#: The packages of pyproject's extras (the base install is the SDK and this CLI): a command that
#: needs one that is not installed says which extra to install, in one line.
EXTRA_OF = {"faust": "workers", "mode": "workers", "aiokafka": "workers", "rocksdict": "workers", "boto3": "s3",
            "botocore": "s3", "starlette": "serve", "uvicorn": "serve", "httptools": "serve", "matplotlib": "plots"}


class _State:
    config_path: Optional[Path] = None
    verbose: bool = False
    _settings: Optional[Settings] = None

    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_settings(self.config_path)
        return self._settings


state = _State()


@app.callback()
def _root(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Config file (.toml, .yaml, .json)."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show tracebacks and debug output."),
) -> None:
    state.config_path = config
    state.verbose = verbose
    state._settings = None  # loaded afresh for each invocation (main() may be called more than once)


# -- dev ----------------------------------------------------------------------------------


def _dev_dir(state_dir: Optional[Path]) -> Path:
    return state_dir or Path(os.environ.get("BANDITSTREAM_DEV_DIR", DEFAULT_DEV_DIR))


@dev_app.command("up")
def dev_up(
    state_dir: Optional[Path] = typer.Option(None, help=f"Where ports, pids and logs go (default {DEFAULT_DEV_DIR})."),
    s3: bool = typer.Option(True, help="Start the S3 server too."),
    workers: bool = typer.Option(
        False, "--workers", help="Also create the topics, generate keys (unless publish.keys_dir has some), start join, learn, publish.",
    ),  # fmt: skip
) -> None:
    """Start the broker and S3 server on free loopback ports and print how to reach them.

    The table goes to stderr and the `export` lines to stdout: `eval "$(banditstream dev up)"`."""
    stack = LocalStack(_dev_dir(state_dir), s3=s3)
    with err_console.status("starting the local stack…"):
        info = stack.up()
        if workers:
            try:
                info = stack.start_workers(state.config_path)
            except BaseException:
                stack.down()
                raise
    table = Table("process", "pid", "address", title="local stack", caption=f"logs in {stack.state_dir}")
    for proc in info.processes:
        address = {"tansu": info.kafka_bootstrap, "seaweedfs": info.s3_endpoint}.get(proc.name)
        table.add_row(proc.name, str(proc.pid), address or f"http://127.0.0.1:{proc.ports[0]}/metrics")
    err_console.print(table)
    print("# connection settings (the same from `banditstream dev env`):")
    for name, value in info.environment().items():
        print(f"export {name}={value}")


@dev_app.command("down")
def dev_down(state_dir: Optional[Path] = typer.Option(None, help="The state directory given to `dev up`.")) -> None:
    """Stop everything `dev up` started (the workers first) and wait until their ports are free."""
    stopped = LocalStack(_dev_dir(state_dir)).down()
    if not stopped:
        console.print("no local stack is running")
    for proc in stopped:
        console.print(f"stopped {proc.name} (pid {proc.pid})")


@dev_app.command("status")
def dev_status(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Show the running local stack, if any."""
    info = LocalStack(_dev_dir(state_dir)).status()
    if info is None:
        console.print("no local stack is running")
        raise typer.Exit(1)
    print(json.dumps(info.environment(), indent=2))


@dev_app.command("env")
def dev_env(state_dir: Optional[Path] = typer.Option(None)) -> None:
    """Print `export` lines for the running local stack."""
    info = LocalStack(_dev_dir(state_dir)).status()
    if info is None:
        raise StackError("no local stack is running (run `banditstream dev up`)")
    for name, value in info.environment().items():
        print(f"export {name}={value}")


# -- topics and config --------------------------------------------------------------------


@topics_app.command("create")
def topics_create() -> None:
    """Create the topics (idempotent) and verify decisions/rewards co-partitioning."""
    settings = state.settings()
    counts = ensure_topics(settings.kafka, settings.topics)
    table = Table("topic", "partitions", title=f"topics on {settings.kafka.bootstrap_servers}")
    for name, count in counts.items():
        table.add_row(name, str(count))
    console.print(table)


@config_app.command("show")
def config_show() -> None:
    """Print the effective configuration (file + environment) as JSON."""
    print(state.settings().model_dump_json(indent=2))


# -- workers ------------------------------------------------------------------------------


def _one_blas_thread() -> None:
    """Workers apply many small per-arm products; multi-threaded BLAS only stalls on them when
    the cores are shared (measured: 85 ms instead of 1.4 ms per 1,000-row batch at d=128)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def _process_settings(command: str) -> Settings:
    """The settings of a process that shares its topics with other processes: refused with a
    ``mock://`` registry, which lives inside one process only (the others could not decode
    what it registers)."""
    settings = state.settings()
    url = settings.registry.url or ""
    if url.startswith("mock://"):
        raise ConfigError(
            f"registry.url: {url!r} is an in-process registry; `banditstream {command}` shares its topics with other "
            "processes, which cannot see it: use a registry server's http(s):// URL, or none (single-object framing)"
        )
    return settings


@app.command()
def join() -> None:
    """Run the join worker: decisions + rewards -> one UpdateEvent per decision. SIGTERM stops it gracefully."""
    from streams.join import run_join

    settings = _process_settings("join")
    _one_blas_thread()
    run_join(settings.worker_config())


@app.command()
def learn() -> None:
    """Run the learner worker: updates -> posterior shards in RocksDB. SIGTERM stops it gracefully."""
    from streams.learn import run_learner

    settings = _process_settings("learn")
    _one_blas_thread()
    run_learner(settings.worker_config())


@app.command()
def publish() -> None:
    """Run the publisher worker: posterior shards -> guarded, signed, versioned snapshots.
    SIGTERM stops it gracefully; SIGUSR2 publishes every domain with new learning now."""
    import threading

    from prometheus_client import start_http_server

    from publisher.publish import PublisherMetrics
    from publisher.worker import run_publisher

    settings = _process_settings("publish")
    if not logging.getLogger().handlers:  # a line per publish, timestamped, as the learner logs
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())  # finish the current publish, then leave
    publish_now = threading.Event()
    signal.signal(signal.SIGUSR2, lambda *_: publish_now.set())  # before the metrics answer: see Playground
    metrics = PublisherMetrics()
    server, _ = start_http_server(settings.metrics.port, addr=settings.metrics.host, registry=metrics.registry)
    console.print(f"publisher metrics on http://{settings.metrics.host}:{server.server_port}/metrics", highlight=False)
    _one_blas_thread()
    run_publisher(settings.worker_config(), _publisher_settings(settings), stop=stop, metrics=metrics, publish_now=publish_now)


@app.command()
def serve(
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="Config file (.toml, .yaml, .json); as the global --config."),
    host: Optional[str] = typer.Option(None, "--host", help="Address to bind (default: serve.host)."),
    port: Optional[int] = typer.Option(None, "--port", min=0, max=65535, help="Port (default: serve.port; 0 picks a free one)."),
) -> None:
    """Run the Personalizer-compatible REST service (rank, reward, activate, ...). SIGTERM stops it."""
    from banditstream.serve import run

    if config is not None:
        state.config_path, state._settings = config, None
    if host is not None and not host.strip():
        raise typer.BadParameter("must not be empty", param_hint="'--host'")
    run(_process_settings("serve"), host=host, port=port)


def _store(settings: Settings):
    return settings.snapshot_store()


def _configured(settings: Settings, domain: str) -> None:
    """Refuse a ``--domain`` the configuration does not declare, in one line."""
    if domain not in settings.domains:
        raise ConfigError(f"--domain: {domain!r} is not a configured domain (known: {', '.join(sorted(settings.domains)) or 'none'})")


def _publisher_config(settings: Settings):
    return settings.publisher_config()


def _publisher_settings(settings: Settings):
    from publisher.cli_ops import load_keys
    from publisher.worker import PublisherSettings

    keys, root = load_keys(settings.publish.keys_dir)
    return PublisherSettings(
        store=_store(settings),
        keys=keys,
        root=root,
        config=_publisher_config(settings),
        every_updates=settings.publish.every_updates,
        every_seconds=settings.publish.every_seconds,
    )


def _domain_list(domains: Optional[str]) -> Optional[list[str]]:
    return [d for d in domains.split(",") if d] if domains else None


def _rows_table(rows: list[dict], title: str, columns: list[str]) -> Table:
    table = Table(*columns, title=title)
    for row in rows:
        table.add_row(*("" if row.get(c) is None else str(row.get(c)) for c in columns))
    return table


TENANT = typer.Option(None, "--tenant", help="Tenant (default: the config's).")
WORKSPACE = typer.Option(None, "--workspace", help="Workspace (default: the config's).")
DOMAINS = typer.Option(None, "--domains", help="Only these domains, comma-separated.")
VERBOSE = typer.Option(False, "--verbose", help="More detail per row.")


@keys_app.command("generate")
def keys_generate(
    directory: Optional[Path] = typer.Option(None, "--dir", help="Where to write them (default: publish.keys_dir)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing root of trust."),
) -> None:
    """Generate root, targets, snapshot and timestamp keys and sign root.json."""
    from publisher.cli_ops import generate_keys

    report = generate_keys(directory or state.settings().publish.keys_dir, overwrite=overwrite)
    table = Table("role", "key ids", "threshold", title=f"keys in {report.directory}")
    for role, keyids in report.keyids.items():
        table.add_row(role, ", ".join(k[:16] for k in keyids), str(report.thresholds[role]))
    console.print(table)
    console.print(f"trusted root: {report.root_file} (expires {report.root_expires:%Y-%m-%d}); keep the root key offline")


@snapshot_app.command("list")
def snapshot_list(tenant: Optional[str] = TENANT, workspace: Optional[str] = WORKSPACE, domains: Optional[str] = DOMAINS, verbose: bool = VERBOSE) -> None:
    """Every kept version per domain, newest last."""
    from publisher.cli_ops import list_snapshots

    settings = state.settings()
    rows = list_snapshots(_store(settings), tenant=tenant, workspace=workspace, domains=_domain_list(domains), verbose=verbose)
    for table in _snapshot_tables(rows, verbose):
        console.print(table)


def _snapshot_tables(rows: list[dict], verbose: bool) -> list[Table]:
    """`snapshot list`, readable at 80 columns: one table of the main fields per
    tenant/workspace, or with ``verbose`` one field/value table per version."""
    columns = ["domain", "version", "channels", "samples", "arms", "created (UTC)"]
    if any("acting" in row for row in rows):
        columns.append("acting")
    if not rows:
        return [_rows_table([], "snapshots", columns)]
    if verbose:
        tables = []
        for row in rows:
            table = Table("field", "value", title=f"{row['tenant']}/{row['workspace']} {row['domain']} {row['version']}")
            table.columns[1].overflow = "fold"
            for key, value in row.items():
                if key not in ("tenant", "workspace", "domain", "version"):
                    table.add_row(key, "" if value is None else ", ".join(map(str, value)) if isinstance(value, list) else str(value))
            tables.append(table)
        return tables
    grouped: dict[str, Table] = {}
    for row in rows:
        where = f"{row['tenant']}/{row['workspace']}"
        table = grouped.get(where)
        if table is None:
            table = grouped[where] = Table(*columns, title=f"snapshots of {where}")
            for column in table.columns[:2]:  # the ids whole; channels and time wrap when space is short
                column.no_wrap = True
        created = (row["created_at"] or "").replace("T", " ").split(".")[0].rstrip("Z")
        cells = [row["domain"], row["version"], ", ".join(row["channels"]), str(row["samples"]), str(row["arms"]), created]
        table.add_row(*cells, *([row.get("acting", "")] if "acting" in columns else []))
    return list(grouped.values())


@snapshot_app.command("verify")
def snapshot_verify(tenant: Optional[str] = TENANT, workspace: Optional[str] = WORKSPACE, domains: Optional[str] = DOMAINS, verbose: bool = VERBOSE) -> None:
    """Verify every repository as a fresh client would, then every kept blob; exit 1 on any failure."""
    from publisher.cli_ops import verify_snapshots

    settings = state.settings()
    rows = verify_snapshots(
        _store(settings), settings.trusted_root_path, tenant=tenant, workspace=workspace, domains=_domain_list(domains), verbose=verbose
    )
    console.print(_rows_table(rows, "verification", ["domain", "check", "ok", "version", "kind", "message"]))
    if not all(row["ok"] for row in rows):
        raise typer.Exit(1)


@snapshot_app.command("dump")
def snapshot_dump(
    domain: str = typer.Argument(..., help="The domain."),
    version: Optional[str] = typer.Option(None, "--version", help="A kept version (default: the channel's head)."),
    channel: str = typer.Option("stable", "--channel"),
    out: Optional[Path] = typer.Option(None, "--out", help="Also write the verified blob here (for restore)."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    verbose: bool = VERBOSE,
) -> None:
    """One verified snapshot as JSON (arrays left out)."""
    from publisher.cli_ops import dump_snapshot

    settings = state.settings()
    summary = dump_snapshot(
        _store(settings), settings.trusted_root_path, domain=domain, tenant=tenant or settings.tenant,
        workspace=workspace or settings.workspace, channel=channel, version=version, out=out, verbose=verbose,
    )  # fmt: skip
    print(json.dumps(summary, indent=2, default=str))


@snapshot_app.command("restore")
def snapshot_restore(
    source: Path = typer.Argument(..., help="A directory of dumped snapshots (*.avro.zst)."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    domains: Optional[str] = DOMAINS,
    verbose: bool = VERBOSE,
) -> None:
    """Re-publish backed-up snapshots as new versions; unknown domains and other majors are skipped with a message."""
    from publisher.cli_ops import load_keys, restore_snapshots

    settings = state.settings()
    keys, root = load_keys(settings.publish.keys_dir)
    report = restore_snapshots(
        source, _store(settings), keys, root, domains_config=settings.domains, tenant=tenant or settings.tenant,
        workspace=workspace or settings.workspace, domains=_domain_list(domains), config=_publisher_config(settings), verbose=verbose,
    )  # fmt: skip
    for message in report.messages:
        console.print(message, highlight=False)


@snapshot_app.command("promote")
def snapshot_promote(
    version: Optional[str] = typer.Option(None, "--version", help="Default: each domain's canary head."),
    channel: str = typer.Option("stable", "--channel"),
    source: str = typer.Option("canary", "--from"),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    domains: Optional[str] = DOMAINS,
) -> None:
    """Make a version (default: the canary head) the head of a channel."""
    from publisher.cli_ops import load_keys, promote

    settings = state.settings()
    keys, root = load_keys(settings.publish.keys_dir)
    rows = promote(
        _store(settings), keys, root, domains_config=settings.domains, tenant=tenant or settings.tenant,
        workspace=workspace or settings.workspace, domains=_domain_list(domains), version=version, channel=channel, source=source,
    )  # fmt: skip
    for row in rows:
        console.print(row["message"], highlight=False)


@snapshot_app.command("rollback")
def snapshot_rollback(
    to_version: Optional[str] = typer.Option(None, "--to", help="The version whose state to publish again (default: the previous one)."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    domains: Optional[str] = DOMAINS,
) -> None:
    """Publish a NEW version carrying older state, so no client ever moves backwards."""
    from publisher.cli_ops import load_keys, rollback

    settings = state.settings()
    keys, root = load_keys(settings.publish.keys_dir)
    rows = rollback(
        _store(settings), keys, root, domains_config=settings.domains, tenant=tenant or settings.tenant,
        workspace=workspace or settings.workspace, domains=_domain_list(domains), to_version=to_version,
    )  # fmt: skip
    for row in rows:
        console.print(row["message"], highlight=False)


@snapshot_app.command("reset")
def snapshot_reset(
    domain: str = typer.Option(..., "--domain", help="The domain whose model to reset."),
    yes: bool = typer.Option(False, "--yes", help="Confirm: what the domain learned is dropped."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
) -> None:
    """Reset a domain's model to its priors: a marker for the learners on every updates partition, then a new version of the priors."""
    from publisher.cli_ops import reset_model

    settings = state.settings()
    _configured(settings, domain)
    if not yes:
        raise ConfigError(f"--yes: a reset drops everything {domain!r} learned (the updates stay in the log); pass --yes to confirm")
    publisher = settings.publisher(tenant=tenant, workspace=workspace)
    topic = settings.topics.updates
    with err_console.status(f"writing reset markers to {topic} and publishing {domain}'s priors"):
        done = reset_model(publisher, domain, settings.kafka, topic, settings.worker_config().serde("update", topic=topic))
    console.print(done["message"], highlight=False)


@snapshot_app.command("ack-drift")
def snapshot_ack_drift(
    domain: str = typer.Option(..., "--domain", help="The domain whose flagged drift to accept."),
    note: str = typer.Option("", "--note", help="Why (kept in the audit log)."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
) -> None:
    """Accept the drift the publisher's guard flags: it judges from the data of the next snapshot on."""
    settings = state.settings()
    _configured(settings, domain)
    at = settings.publisher(tenant=tenant, workspace=workspace).repository(domain).acknowledge_drift(note)
    console.print(f"{domain}: drift acknowledged at {at.isoformat(timespec='seconds')}; the next snapshot's data is the new "
                  "reference", highlight=False)  # fmt: skip


@snapshot_app.command("gate")
def snapshot_gate(
    domain: str = typer.Option(..., "--domain", help="The domain whose canary to judge."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the decision and its figures here."),
) -> None:
    """Run the promotion gate once: promote the canary on evidence, roll it back when it is worse, or wait and say why."""
    from learner.domain import DomainSettings
    from publisher.cli_ops import load_keys
    from publisher.gate import Gate, GateConfig
    from publisher.publish import Publisher
    from streams.evaluation_log import domain_log_reader

    settings = state.settings()
    tenant, workspace = tenant or settings.tenant, workspace or settings.workspace
    domain_settings = settings.domains.get(domain) or DomainSettings()
    keys, root = load_keys(settings.publish.keys_dir)
    publisher = Publisher(_store(settings), keys, root, domains={domain: domain_settings}, tenant=tenant, workspace=workspace,
                          config=_publisher_config(settings))
    topic = settings.topics.updates
    read_log = domain_log_reader(settings.kafka, topic, settings.worker_config().serde("update", topic=topic))
    with err_console.status(f"reading {topic} and judging {domain}'s canary"):
        decision = Gate(publisher, read_log).run(domain, GateConfig.from_settings(getattr(domain_settings, "promotion", {})))
    table = Table("domain", "action", "stable", "canary", "rows", "canary rows", title="promotion gate")
    table.add_row(domain, decision.action, decision.stable_version or "-", decision.canary_version or "-",
                  f"{decision.rows:,}", f"{decision.canary_rows:,}")
    console.print(table)
    console.print(decision.reason, highlight=False)
    if json_path is not None:
        json_path.write_text(json.dumps(decision.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")


# -- the main job -------------------------------------------------------------------------


@app.command()
def demo(
    events: int = typer.Option(20_000, "--events", min=10, help="Decisions to make (spread over the domains)."),
    domains: str = typer.Option(",".join(DEMO_DOMAINS), "--domains", help="Simulated domains, comma-separated."),
    policy: str = typer.Option("portfolio", "--policy", help="Policy for every domain (portfolio, lin_igw, lin_ts, lin_ucb, ...)."),
    seed: int = typer.Option(7, "--seed", help="Seed of the workload and the SDK's draws."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the summary here as JSON."),
    plot: Path = typer.Option(Path("banditstream-demo.png"), "--plot", help="Where to write the PNG."),
    round_size: int = typer.Option(1000, "--round-size", min=10, help="Decisions per snapshot round."),
    s3: bool = typer.Option(False, "--s3", help="Publish snapshots to the embedded S3 server instead of a directory."),
    keep: Optional[Path] = typer.Option(None, "--keep", help="Keep the working directory (logs, state, snapshots) here."),
) -> None:
    """Run the whole loop on the embedded default and show it learning a simulated workload."""
    from banditstream import demo as demo_module
    from learner.policies import POLICIES

    if policy not in POLICIES:
        raise typer.BadParameter(f"unknown policy {policy!r}; known: {', '.join(sorted(POLICIES))}", param_hint="'--policy'")
    chosen = tuple(d for d in domains.split(",") if d)
    options = demo_module.DemoOptions(
        events=events, domains=chosen, policy=policy, seed=seed, json_path=json_path, plot_path=plot,
        round_size=round_size, s3=s3, workdir=keep,
    )  # fmt: skip
    demo_module.run(options, console=console)


@app.command()
def replay(
    path: Path = typer.Argument(..., help="A JSONL interaction log or an Avro file of Decision/Reward events."),
    domain: str = typer.Option(..., "--domain", help="Domain the logged decisions belong to."),
    actions: Optional[str] = typer.Option(None, "--actions", help="Candidate ids, comma-separated (default: agents seen in the log)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Validate and report only; produce nothing."),
) -> None:
    """Warm-start from logs: validate every line, report bad ones by line number, produce the rest."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from banditstream import replay as replay_module
    from streams.client import EventProducer

    settings = state.settings() if dry_run else _process_settings("replay")
    result = replay_module.read_log(
        path,
        domain=domain,
        actions=[a for a in actions.split(",") if a] if actions else None,
        tenant=settings.tenant,
        workspace=settings.workspace,
        validator=Validator(settings.validation_limits()),
    )
    for problem in result.problems:
        err_console.print(f"[yellow]skipped[/] {problem}", highlight=False)
    table = Table("lines", "decisions", "rewards", "skipped", "uniform propensity assumed", title=f"replay of {path.name}")
    table.add_row(str(result.lines), str(len(result.decisions)), str(len(result.rewards)), str(len(result.problems)), str(result.assumed_uniform))
    console.print(table)
    if dry_run:
        return
    total = len(result.decisions) + len(result.rewards)
    columns = (TextColumn("producing"), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, console=console) as progress:
        task = progress.add_task("produce", total=total)
        sent = replay_module.produce(
            result,
            EventProducer(settings.kafka),
            decisions_topic=settings.topics.decisions,
            rewards_topic=settings.topics.rewards,
            registry=settings.registry,
            progress=lambda n: progress.advance(task, n),
        )
    console.print(f"produced {sent} events to {settings.topics.decisions} and {settings.topics.rewards}")


@app.command()
def evaluate(
    domain: str = typer.Option(..., "--domain", help="The domain whose log to evaluate on."),
    log: str = typer.Option("topic", "--log", help="'topic' (the updates topic), 'topic:NAME', or .avro/.jsonl files, comma-separated."),
    candidates: str = typer.Option(
        "uniform,logging", "--candidates",
        help="uniform, logging, always:ARM, snapshot:VERSION|CHANNEL, shadow[:VERSION], POLICY(param=v1|v2,...), comma-separated.",
    ),
    estimators: str = typer.Option("ips,snips,dr", "--estimators", help="ips, snips, dm, dr, sndr, switch_dr:TAU, dros:LAMBDA, ips:CLIP."),
    bootstrap: int = typer.Option(0, "--bootstrap", min=0, help="Bootstrap resamples for the intervals (0: the closed-form Gaussian)."),
    seed: int = typer.Option(0, "--seed", help="Seeds the reward model's folds, Thompson draws and the bootstrap."),
    level: float = typer.Option(0.95, "--level", min=0.5, max=0.999, help="Interval level."),
    since: Optional[str] = typer.Option(None, "--since", help="Decisions from this time on (ISO 8601 or epoch ms)."),
    until: Optional[str] = typer.Option(None, "--until", help="Decisions before this time (ISO 8601 or epoch ms)."),
    batch_size: int = typer.Option(200, "--batch-size", min=1, help="Rows per learning step of a progressive candidate."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the figures here."),
    png: Optional[Path] = typer.Option(None, "--png", help="Write a forest plot of the candidates here."),
) -> None:
    """Rate candidate policies on a logged domain, off-policy (IPS, SNIPS, DR, ... with intervals)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from banditstream import evaluate as ev
    from learner.domain import DomainSettings

    settings = state.settings()
    tenant, workspace = tenant or settings.tenant, workspace or settings.workspace
    domain_settings = settings.domains.get(domain) or DomainSettings()
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err_console, transient=True) as progress:

        def read_topic(name: Optional[str]) -> list[dict]:
            from streams.evaluation_log import read_updates

            topic = name or settings.topics.updates
            task = progress.add_task(f"reading {topic}", total=None)
            config = settings.worker_config()
            updates, report = read_updates(settings.kafka, topic, config.serde("update", topic=topic),
                                           progress=lambda n: progress.update(task, completed=n))
            progress.update(task, total=report.records, completed=report.records)
            if report.undecodable:
                err_console.print(f"[yellow]skipped[/] {report.undecodable} records of {topic} that do not decode")
            return updates

        logged = ev.load_log(log, domain=domain, domain_settings=domain_settings, tenant=tenant, workspace=workspace,
                             read_topic=read_topic, since_ms=_time_ms(since, "--since"), until_ms=_time_ms(until, "--until"))

        def snapshot(which: str):
            from publisher.cli_ops import load_snapshot

            channel, version = (which, None) if which in ("stable", "canary") else ("stable", which)
            snap, _ = load_snapshot(_store(settings), settings.trusted_root_path, domain=domain, tenant=tenant,
                                    workspace=workspace, channel=channel, version=version)
            return snap.load_policy(), snap.version

        chosen = ev.parse_candidates(candidates, snapshots=snapshot, batch_size=batch_size, seed=seed)
        ev.check_candidates(chosen, logged)
        tasks: dict[str, Any] = {}

        def scored(name: str, done: int, total: int) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(f"scoring {name}", total=total)
            progress.update(tasks[name], completed=done)

        run = ev.evaluate_candidates(
            logged, chosen, estimators=[e for e in estimators.split(",") if e], method="bootstrap" if bootstrap else "gaussian",
            level=level, n_resamples=bootstrap or 1000, seed=seed, progress=scored,
        )  # fmt: skip
    console.print(ev.results_table(run))
    if json_path is not None:
        json_path.write_text(json.dumps(run.to_dict(), indent=2, default=str) + "\n", encoding="utf-8")
        console.print(f"figures: {json_path}")
    if png is not None:
        console.print(f"plot: {ev.forest_plot(run, png)}")


@app.command()
def stats(
    domain: str = typer.Option(..., "--domain", help="The domain whose arms to rank."),
    window: str = typer.Option("24h", "--window", help="Decisions stamped this long before now: seconds, or 90s, 15m, 24h, 7d."),
    level: float = typer.Option(0.95, "--level", min=0.5, max=0.999, help="Interval level of the mean rewards."),
    tenant: Optional[str] = TENANT,
    workspace: Optional[str] = WORKSPACE,
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the figures here."),
) -> None:
    """Per-arm statistics and the leaderboard of a domain, from the joined log (as GET /v1/stats)."""
    import time

    from banditstream import stats as st
    from publisher.cli_ops import load_snapshot
    from publisher.errors import PublisherError
    from streams.evaluation_log import LogRange, read_updates

    try:
        window_s = st.parse_window(window)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--window") from None
    settings = state.settings()
    tenant, workspace = tenant or settings.tenant, workspace or settings.workspace
    until_ms = int(time.time() * 1000)
    since_ms = until_ms - int(window_s * 1000)
    topic = settings.topics.updates
    with err_console.status(f"reading {topic}"):
        updates, report = read_updates(settings.kafka, topic, settings.worker_config().serde("update", topic=topic),
                                       log_range=LogRange(since_ms=since_ms))
    policy, version = None, ""
    try:
        snapshot, _ = load_snapshot(_store(settings), settings.trusted_root_path, domain=domain, tenant=tenant, workspace=workspace)
        policy, version = snapshot.load_policy(), snapshot.version
    except PublisherError as exc:
        err_console.print(f"[yellow]no posterior means:[/] {str(exc).splitlines()[0]}")
    board = st.leaderboard(updates, tenant=tenant, workspace=workspace, domain=domain, since_ms=since_ms,
                           until_ms=until_ms, policy=policy, snapshot_version=version, level=level)
    console.print(st.table(board))
    if report.undecodable:
        err_console.print(f"[yellow]skipped[/] {report.undecodable} records of {topic} that do not decode")
    if json_path is not None:
        json_path.write_text(json.dumps(board.to_dict(), indent=2) + "\n", encoding="utf-8")
        console.print(f"figures: {json_path}")


@app.command()
def monitor(
    once: bool = typer.Option(False, "--once", help="Check once; exit 1 if an alert fires (or something cannot be read)."),
    interval: Optional[float] = typer.Option(None, "--interval", min=1.0, help="Check every this many seconds until stopped."),
    window: str = typer.Option("15m", "--window", help="How far back each check looks: seconds, or 90s, 15m, 24h."),
    stale_after: str = typer.Option("1h", "--stale-after", help="A stable snapshot older than this is stale."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the latest report here."),
) -> None:
    """The loop's health from its own records (joined log, dead letters, group lag, snapshots), and the alerts."""
    import threading
    import time

    from banditstream import monitor as mon
    from banditstream import stats as st

    if once == (interval is not None):
        raise typer.BadParameter("give --once or --interval SECONDS (one of them)", param_hint="--once/--interval")
    try:
        thresholds = mon.Thresholds(window_s=st.parse_window(window), stale_s=st.parse_window(stale_after))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--window/--stale-after") from None
    settings = state.settings()
    stop = threading.Event()
    if not once:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
    previous: mon.Report | None = None
    while True:
        with err_console.status("checking"):
            report = mon.check(settings, thresholds, previous=previous)
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report.at_ms / 1000))
        for line in mon.transitions(previous, report) if previous is not None else ():
            console.print(f"{stamp} {line}", highlight=False, soft_wrap=True)
        console.print(f"[bold]{stamp}[/]", highlight=False)
        for table in mon.tables(report):
            console.print(table)
        for line in mon.alert_lines(report):
            console.print(line, highlight=False, soft_wrap=True)
        if json_path is not None:  # whole or not at all, for whoever reads it meanwhile
            partial = json_path.with_name(json_path.name + ".partial")
            partial.write_text(json.dumps(report.to_dict(), indent=2) + "\n", encoding="utf-8")
            partial.replace(json_path)
        if once:
            raise typer.Exit(1 if report.alerts or report.problems else 0)
        previous = report
        if stop.wait(interval):
            return


@app.command()
def doctor() -> None:
    """Check the config against the services it names: broker, topics, registry, snapshot store, keys, clock; and its domains."""
    from banditstream.doctor import run_checks

    with err_console.status("checking"):
        checks = run_checks(state.settings())
    marks = {"ok": "[green]ok[/]", "warning": "[bold yellow]warning[/]", "failed": "[bold red]FAILED[/]", "skipped": "[yellow]skipped[/]"}
    width = max(len(c.name) for c in checks)
    for c in checks:
        line = f"{marks[c.status]}  {c.name:<{width}}  {c.detail}"
        if c.fix:
            line += f" [dim]->[/] {c.fix}"
        console.print(line, highlight=False, soft_wrap=True)
    if any(c.status == "failed" for c in checks):
        raise typer.Exit(1)


def _time_ms(text: Optional[str], flag: str) -> Optional[int]:
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    from datetime import datetime, timezone

    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither epoch ms nor ISO 8601", param_hint=flag) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return int(moment.timestamp() * 1000)


# -- entry point --------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    """Console-script entry point: expected errors become one line and exit code 2.

    ``kill -USR1 <pid>`` prints every thread's stack to stderr (a stuck worker, a slow stop).
    """
    if hasattr(faulthandler, "register"):  # not on Windows
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (OSError, ValueError):  # stderr is no file (embedded, captured): no stack dumps then
            pass
    try:
        # without standalone mode click hands back a command's typer.Exit code instead of exiting
        code = app(args=argv, prog_name="banditstream", standalone_mode=False)
    except EXPECTED_ERRORS as exc:
        if state.verbose:
            raise
        err_console.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
        return 2
    except ModuleNotFoundError as exc:
        extra = EXTRA_OF.get((exc.name or "").partition(".")[0])
        if extra is None or state.verbose:
            raise
        message = (f"this command needs {exc.name!r}, which comes with the '{extra}' extra: "
                   f"pip install 'banditstream[{extra}]' (or 'banditstream[all]')")
        err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        err_console.print("interrupted: everything started here has been stopped")
        return 130
    except typer.Exit as exc:
        return exc.exit_code
    except typer.TyperException as exc:
        # usage errors (a bad command, flag or value) of the click typer bundles, which is not
        # the `click` package: `click.ClickException` never matches them
        message = " ".join(exc.format_message().split()).rstrip(".")
        if message:  # empty for a bare command group, whose help typer has printed already
            ctx = getattr(exc, "ctx", None)
            hint = f"; see '{ctx.command_path} --help'" if ctx is not None else ""
            err_console.print(f"[bold red]error:[/] {escape(message)}{hint}", highlight=False, soft_wrap=True)
        return exc.exit_code
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
