"""Every usage error of the `banditstream` command is one line on stderr and exit code 2.

A few cases run the installed console script as a user does; the rest call its entry point,
`banditstream.cli.main`, in-process (typer's CliRunner would skip the entry point's handling).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from banditstream.cli import main

CONSOLE_SCRIPT = Path(sys.executable).parent / "banditstream"


def _assert_one_line(code: int, stderr: str, *names: str) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ") and "Traceback" not in stderr
    for name in names:
        assert name in lines[0], lines[0]


@pytest.mark.parametrize(
    "args, names",
    [
        (["nosuch"], ["'nosuch'"]),
        (["demo", "--evnts", "30"], ["--evnts", "--events"]),  # names the option meant, too
        (["demo", "--events", "abc"], ["'--events'", "integer"]),
    ],
    ids=["unknown-command", "unknown-flag", "bad-int"],
)
def test_console_script_usage_error_is_one_line_and_exit_2(tmp_path, args, names):
    result = subprocess.run(
        [str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "COLUMNS": "80"},
    )  # fmt: skip
    _assert_one_line(result.returncode, result.stderr, *names)
    assert result.stdout == ""


@pytest.mark.parametrize(
    "args, names",
    [
        (["--nope"], ["--nope"]),
        (["snapshot", "nosuch"], ["'nosuch'", "banditstream snapshot --help"]),
        (["demo", "--events", "-5"], ["'--events'", "greater than or equal to 10"]),
        (["demo", "--events", "5"], ["'--events'"]),
        (["evaluate", "--domain", "d", "--level", "2"], ["'--level'"]),
        (["evaluate", "--domain", "d", "--bootstrap", "1.5"], ["'--bootstrap'"]),
        (["demo", "--policy", "nonsense"], ["'--policy'", "'nonsense'", "lin_ts"]),
        (["snapshot", "dump"], ["'domain'"]),
        (["snapshot", "gate"], ["'--domain'"]),
        (["--config"], ["'--config'"]),
        (["evaluate", "--domain", "d", "--since", "yesterday"], ["--since", "'yesterday'"]),
        (["stats", "--domain", "d", "--window", "soon"], ["--window", "'soon'"]),
    ],
    ids=[
        "unknown-root-flag", "unknown-subcommand", "negative-int", "int-below-min", "float-above-max", "float-for-int",
        "bad-choice", "missing-argument", "missing-required-option", "option-without-value", "bad-time", "bad-window",
    ],
)  # fmt: skip
def test_usage_error_is_one_line_and_exit_2(capsys, args, names):
    code = main(args)
    out, err = capsys.readouterr()
    _assert_one_line(code, err, *names)
    assert out == ""


@pytest.mark.parametrize(
    "config, names",
    [
        ('[kafka]\nbootstrap_servrs = "x"\n', ["kafka.bootstrap_servrs", "unknown field"]),
        ('[publish]\nkeep_versions = "many"\n', ["publish.keep_versions", "'many'"]),
    ],
    ids=["unknown-field", "bad-value"],
)
def test_bad_config_field_is_one_line_and_exit_2(tmp_path, capsys, config, names):
    path = tmp_path / "bandit.toml"
    path.write_text(config)
    code = main(["--config", str(path), "config", "show"])
    out, err = capsys.readouterr()
    _assert_one_line(code, err, str(path), *names)
    assert out == ""


def test_bare_command_group_prints_its_help_and_no_error(capsys):
    code = main(["snapshot"])
    out, err = capsys.readouterr()
    assert code == 2 and err == ""
    assert "promote" in out and "rollback" in out


@pytest.mark.parametrize("command", ["join", "learn", "publish", "serve"])
def test_a_mock_registry_is_refused_for_a_process_that_shares_its_topics(tmp_path, capsys, command):
    """mock:// is a registry inside one process: a worker (or serve) with it would register
    schemas no other process can see. Refused before anything connects; the demo and tests,
    in one process, keep it."""
    path = tmp_path / "bandit.toml"
    path.write_text('[registry]\nurl = "mock://team"\n')
    code = main(["--config", str(path), command])
    out, err = capsys.readouterr()
    _assert_one_line(code, err, "registry.url", "'mock://team'", f"banditstream {command}")
    assert out == ""
