"""The `disttrain` command line, run as a real subprocess of the installed script."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from disttrain_api.crd import crd_yaml
from disttrain_cli import SUBCOMMANDS, build_parser
from disttrain_operator import __version__

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(str(p) for p in (ROOT / "manifests" / "examples").glob("*.yaml"))


def disttrain_bin() -> str:
    beside = Path(sys.executable).parent / "disttrain"  # .venv/bin/python -> .venv/bin/disttrain
    found = str(beside) if beside.exists() else shutil.which("disttrain")
    assert found, "the disttrain console script is not installed (pip install -e .)"
    return found


def run(*args: str, stdin: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [disttrain_bin(), *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=cwd
    )


GOOD = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata: {name: ok}
spec: {mode: data, workers: {replicas: 2}}
"""

BAD = """\
apiVersion: disttrain.dev/v1alpha1
kind: DistTrainJob
metadata:
  name: bad
spec:
  mode: data
  workers: {replicas: 2, procsPerWorker: 2}
  parallelism: {tensor: 3}
  training: {precision: fp16}
  elastic: {minReplicas: 3}
"""
BAD_LINES = [
    "spec.parallelism.tensor: 3 does not divide the world size 4 (workers.replicas 2 x procsPerWorker 2)",
    "spec.parallelism.tensor: must be 1 in mode data (got 3); tensor parallelism needs mode tensor or hybrid",
    "spec.elastic.minReplicas: 3 must be <= workers.replicas 2",
    "spec.training.precision: fp16 needs GPUs (workers.resources.gpus is 0); use bf16 or fp32 on CPU",
]


@pytest.mark.parametrize("command", ["validate", "crd", "version", "local", "operator"])
def test_every_subcommand_has_help(command: str) -> None:
    result = run(command, "--help")
    assert result.returncode == 0, result.stderr
    assert f"usage: disttrain {command}" in result.stdout


def test_top_level_help_lists_commands() -> None:
    result = run("--help")
    assert result.returncode == 0
    for command in SUBCOMMANDS:
        assert f"\n    {command}  " in result.stdout, command


@pytest.mark.parametrize("command", ["submit", "status", "logs", "delete"])
def test_the_job_commands_take_kubectls_cluster_flags(command: str) -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[command]
    text = sub.format_help()
    for flag in ("-n NS, --namespace NS", "--kubeconfig FILE", "--context NAME"):
        assert flag in text, (command, flag)


def test_version() -> None:
    result = run("version")
    assert (result.returncode, result.stdout) == (0, f"disttrain {__version__} (API disttrain.dev/v1alpha1)\n")


def test_crd_prints_the_generated_crd() -> None:
    result = run("crd")
    assert result.returncode == 0 and result.stdout == crd_yaml()
    assert yaml.safe_load(result.stdout)["kind"] == "CustomResourceDefinition"


def test_validate_examples_exit_0() -> None:
    result = run("validate", *EXAMPLES)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert len(result.stdout.splitlines()) == len(EXAMPLES)
    assert all(": valid (DistTrainJob " in line for line in result.stdout.splitlines())


def test_validate_lists_every_problem_and_exits_2(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text(BAD)
    (tmp_path / "good.yaml").write_text(GOOD)
    result = run("validate", "good.yaml", "bad.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == "good.yaml: valid (DistTrainJob ok: mode data, world size 2 = tensor 1 x pipeline 1 x data 2)\n"
    assert result.stderr.splitlines() == [f"bad.yaml: {line}" for line in BAD_LINES] + [
        "disttrain validate: 4 problems in 1 of 2 file(s)"
    ]


def test_validate_quiet(tmp_path: Path) -> None:
    (tmp_path / "good.yaml").write_text(GOOD)
    result = run("validate", "-q", "good.yaml", cwd=tmp_path)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "broken.yaml").write_text("apiVersion: disttrain.dev/v1alpha1\nkind: DistTrainJob\nspec:\n  mode: data\n   workers: 2\n")
    result = run("validate", "broken.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "broken.yaml:5:11: YAML syntax error: mapping values are not allowed here"


def test_duplicate_keys_are_errors(tmp_path: Path) -> None:
    (tmp_path / "dup.yaml").write_text(GOOD + "spec: {mode: tensor}\n")
    result = run("validate", "dup.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "dup.yaml:5:1: YAML syntax error: duplicate key 'spec'"


def test_multi_document_files(tmp_path: Path) -> None:
    service = "apiVersion: v1\nkind: Service\nmetadata: {name: s}\n"
    (tmp_path / "all.yaml").write_text(GOOD + "---\n" + service + "---\n" + BAD + "---\n")
    result = run("validate", "all.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout.splitlines() == [
        "all.yaml:doc 1: valid (DistTrainJob ok: mode data, world size 2 = tensor 1 x pipeline 1 x data 2)",
        "all.yaml:doc 2: skipped (Service is not a DistTrainJob)",
    ]
    assert result.stderr.splitlines()[:-1] == [f"all.yaml:doc 3: {line}" for line in BAD_LINES]


def test_stdin_and_missing_files(tmp_path: Path) -> None:
    result = run("validate", "-", stdin=GOOD)
    assert result.returncode == 0 and result.stdout.startswith("<stdin>: valid")
    result = run("validate", "nope.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == "nope.yaml: cannot read: No such file or directory"


def test_files_without_a_job(tmp_path: Path) -> None:
    (tmp_path / "empty.yaml").write_text("# nothing\n")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    result = run("validate", "empty.yaml", "list.yaml", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        "empty.yaml: no DistTrainJob document found",
        "list.yaml: (document): expected a DistTrainJob object, got a list",
        "disttrain validate: 2 problems in 2 of 2 file(s)",
    ]


def test_usage_errors_exit_2() -> None:
    assert run("validate").returncode == 2
    assert run("no-such-command").returncode == 2
