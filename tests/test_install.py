"""A plain install is the SDK and the CLI, lean; ``[all]`` carries everything else.

The static check reads every import in the runtime packages, lazy ones included, and finds
the distribution behind it among pyproject's dependencies and extras. The install check puts
a copy of the checkout (without compiled extensions) into a fresh venv with ``pip install -c
constraints.txt .``, so the C extensions are built: with no faust, RocksDB, boto3, ASGI
server or matplotlib there, the SDK pulls and verifies a real snapshot and decides, and a
worker command says in one line which extra it needs. Then ``.[all]`` goes in, and every
module imports and the demo's plot and JSON output run on synthetic data: the last steps of
a demo run.
"""

from __future__ import annotations

import ast
import importlib.metadata
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schemas", "streams", "learner", "publisher", "banditstream")


def _normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imported_modules() -> dict[str, set[str]]:
    """Top-level module -> files importing it, for every absolute import in the runtime packages."""
    found: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    found.setdefault(name.partition(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runtime_import_is_a_declared_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for name, extra in project["optional-dependencies"].items()
                                              if name != "dev" for r in extra]  # fmt: skip
    declared = {_normalise(re.match(r"[A-Za-z0-9._-]+", req).group()) for req in requirements}
    distributions = importlib.metadata.packages_distributions()
    undeclared = {}
    for module, files in _imported_modules().items():
        if module in sys.stdlib_module_names or module in PACKAGES:
            continue
        if not {_normalise(d) for d in distributions.get(module, [])} & declared:
            undeclared[module] = sorted(files)
    assert not undeclared, f"imported but not in [project] dependencies: {undeclared}"


SMOKE = r"""
import importlib, json, pkgutil, sys
from pathlib import Path

import numpy as np

for package in sys.argv[2:]:
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(info.name)
import learner._fastscore, streams._avrofast
assert all(m.__file__.startswith(sys.prefix) for m in (learner._fastscore, streams._avrofast))

from banditstream.demo import DomainLog, _Demo
from banditstream.simulate import make_environment

out, rng = Path(sys.argv[1]), np.random.default_rng(0)
demo = object.__new__(_Demo)  # the plot reads only the per-domain logs
demo.logs = {}
for name in ("llm_routing", "support_templates"):
    oracle = rng.uniform(0.6, 1.0, 600)
    demo.logs[name] = DomainLog(make_environment(name), expected=list(oracle - rng.uniform(0, 0.3, 600)),
                                oracle=list(oracle), random=list(oracle - 0.4), swaps=[(200, "v1"), (400, "v2")])
demo._plot(out / "demo.png")
(out / "demo.json").write_text(json.dumps({name: log.figures() for name, log in demo.logs.items()}, indent=2))
"""


LEAN = r"""
import importlib.util, sys
from pathlib import Path

for heavy in ("faust", "rocksdict", "boto3", "starlette", "uvicorn", "matplotlib"):
    assert importlib.util.find_spec(heavy) is None, f"{heavy} is in a plain install"
from banditstream.decider import Decider
from learner.domain import DomainSettings
from publisher import SnapshotClient

repo = Path(sys.argv[1])
settings = DomainSettings(policy="lin_ucb", features={"dimension": 8, "normalize": False})
client = SnapshotClient(repo / "snapshots", repo / "cache", repo / "keys" / "root.json", domain="route")
with Decider("route", repository=client, settings=settings, seed=2) as decider:
    decision = decider.decide({"load": 1.0}, ["small", "large"])
assert decision.policy_version == sys.argv[2] and decision.fallback is None, decision
print(decision.action)
"""


def test_plain_install_builds_extensions_and_runs_the_demo_outputs(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "constraints.txt"):
        shutil.copy2(ROOT / name, source / name)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "-c", "constraints.txt", "."],
        cwd=source, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr

    # lean: the SDK pulls, verifies and decides; a worker says which extra it needs
    from learner.domain import DomainSettings
    from publisher.cli_ops import generate_keys, load_keys
    from publisher.publish import Publisher
    from publisher.stores import open_store

    repo = tmp_path / "repo"
    generate_keys(repo / "keys")
    settings = DomainSettings(policy="lin_ucb", features={"dimension": 8, "normalize": False})
    policy = settings.make_policy(seed=1)
    policy.update_batch(np.ones((20, 8)), ["small", "large"] * 10, [1.0, 0.0] * 10)
    version = Publisher(open_store(repo / "snapshots"), *load_keys(repo / "keys"), domains={"route": settings}).publish(
        "route", policy).version
    lean = subprocess.run([str(venv / "bin" / "python"), "-c", LEAN, str(repo), version], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert lean.returncode == 0 and lean.stdout.strip() in ("small", "large"), lean.stderr
    worker = subprocess.run([str(venv / "bin" / "banditstream"), "join"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert worker.returncode == 2 and worker.stderr.count("\n") == 1, worker.stderr
    assert "pip install 'banditstream[workers]'" in worker.stderr, worker.stderr

    install = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", "-c", "constraints.txt", ".[all]"],
        cwd=source, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    smoke = subprocess.run(
        [str(venv / "bin" / "python"), "-c", SMOKE, str(tmp_path), *PACKAGES],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert smoke.returncode == 0, smoke.stderr
    assert (tmp_path / "demo.png").read_bytes().startswith(b"\x89PNG")
    figures = json.loads((tmp_path / "demo.json").read_text())
    assert set(figures) == {"llm_routing", "support_templates"} and figures["llm_routing"]["snapshots_used"] == 2

    cli = subprocess.run([str(venv / "bin" / "banditstream"), "config", "show"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and '"bootstrap_servers"' in cli.stdout, cli.stderr
