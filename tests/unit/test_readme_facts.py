"""The README checked against the code: every metric name it mentions is defined in
`disttrain_api/metric_names.py`, every `kubectl get dtj` column it shows is the CRD's (same
columns, same order), and every spec or status field path it names exists in the CRD's schema.

Field paths in prose are found in inline code spans (fenced blocks are examples, checked by
test_examples.py and the API's own tests): a dotted name whose first segment is `spec`,
`status` or a top-level spec field (`training.steps`, `checkpoint.intervalSteps`), standing
alone in the span, before a `: value` (`data.format: tokens`) or between words of an
expression (`workers.replicas x workers.procsPerWorker`). Not fields: a file name
(`model.safetensors`, `summary.json`), a Helm value (`metrics.podMonitor.enabled`, a path of the
chart's values.yaml, or anything set with `=`: the chart's `metrics`, not the spec's), a quoted
Python import path (`'pkg.mod:make'`).
The finders are tested on planted text below, so none of them passes for finding nothing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from disttrain_api import metric_names

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
CRD = ROOT / "manifests" / "crd" / "disttrainjobs.yaml"
CHART_VALUES = ROOT / "charts" / "disttrain" / "values.yaml"

# `disttrain_<x>` words that are the project's Python packages, not series.
PACKAGES = {"disttrain_api", "disttrain_operator", "disttrain_trainer", "disttrain_cli"}
# What prometheus_client appends to a family's name in the exposition.
SERIES_SUFFIXES = ("_total", "_sum", "_count", "_bucket", "_created")
# A last segment that makes a dotted name a file, not a field (`model.safetensors`, `config.json`).
FILE_EXTENSIONS = {"json", "jsonl", "safetensors", "png", "yaml", "yml", "py", "pt", "bin", "npy", "npz",
                   "parquet", "txt", "toml", "csv", "md", "crt", "key", "gz", "tar", "html"}  # fmt: skip
# A dotted path inside a code span: after the span's start, a space or "("; ending at the span's
# end, a space, ")", ",", or ": " (a YAML value follows). Not after a quote, "/", ":" or "."
# (an import path, a URL, a longer name), not before "=" (a Helm --set) or any other character.
PATH_IN_SPAN = re.compile(r"(?:^|(?<=[\s(]))([a-z][A-Za-z0-9]*(?:\.[A-Za-z][A-Za-z0-9]*)+)(?=$|[\s),]|:\s|:$)")


def _crd_version() -> dict[str, Any]:
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v.get("served")]
    return dict(version)


def _schema() -> dict[str, Any]:
    return dict(_crd_version()["schema"]["openAPIV3Schema"])


def prose(markdown: str) -> str:
    """The markdown without its fenced code blocks."""
    return re.sub(r"^(```|~~~).*?^\1[^\n]*$", "", markdown, flags=re.S | re.M)


# ---------------------------------------------------------------------------------------- metric names


def defined_metric_names() -> set[str]:
    return {v for k, v in vars(metric_names).items()
            if k.isupper() and isinstance(v, str) and v.startswith(metric_names.PREFIX)}  # fmt: skip


def metric_mentions(markdown: str) -> set[str]:
    """Every `disttrain_...` word (code blocks included: a PromQL query names series too), minus packages."""
    words = set(re.findall(r"(?<![\w./-])disttrain_[a-z0-9_]*", markdown))
    return {w for w in words if w not in PACKAGES and w != metric_names.PREFIX}


def undefined_metrics(mentions: set[str], defined: set[str]) -> list[str]:
    """Mentions that name no defined series: not a defined name, nor one with a Prometheus suffix,
    nor (ending in "_") the prefix of a family of defined names (`disttrain_federated_`)."""

    def known(word: str) -> bool:
        if word.endswith("_"):
            return any(d.startswith(word) for d in defined)
        return word in defined or any(word.endswith(s) and word[: -len(s)] in defined for s in SERIES_SUFFIXES)

    return sorted(w for w in mentions if not known(w))


def test_every_metric_the_readme_names_is_defined() -> None:
    mentions = metric_mentions(README.read_text())
    assert len(mentions) >= 20, f"too few metric names found; the finder is broken: {sorted(mentions)}"
    missing = undefined_metrics(mentions, defined_metric_names())
    assert not missing, f"README.md names series that disttrain_api/metric_names.py does not define: {missing}"


def test_the_metric_finder_on_planted_text() -> None:
    text = ("`disttrain_step_seconds_sum` and `disttrain_comm_exposed_seconds_total` from `disttrain_api/` "
            "and operator/disttrain_operator/, `disttrain_federated_` series, and `disttrain_no_such_thing`.\n"
            "```promql\nrate(disttrain_made_up_total[1m])\n```\n")  # fmt: skip
    mentions = metric_mentions(text)
    assert "disttrain_api" not in mentions and "disttrain_operator" not in mentions
    assert undefined_metrics(mentions, defined_metric_names()) == ["disttrain_made_up_total", "disttrain_no_such_thing"]


# ------------------------------------------------------------------------------------- printer columns


def printer_columns(wide: bool) -> list[str]:
    cols = _crd_version()["additionalPrinterColumns"]
    return ["NAME", *(c["name"].upper() for c in cols if wide or not c.get("priority"))]


def column_samples(markdown: str) -> Iterator[tuple[int, bool, list[str], list[list[str]]]]:
    """(line number, -o wide?, header, data rows) of every `kubectl get dtj` the README shows with
    its output: the header on the line after `$ kubectl get dtj ...` (rows follow it), or in a
    comment on the command's own line (`kubectl get dtj -w   # NAME MODE ...`)."""
    lines = markdown.splitlines()
    for i, line in enumerate(lines):
        command = re.search(r"kubectl get (?:dtj|disttrainjobs)\b([^#`]*)(#\s*(.*))?$", line)
        if not command or "-o" in command.group(1).replace("-o wide", ""):
            continue  # -o yaml / json / jsonpath: not the table
        wide = "-o wide" in command.group(1)
        if command.group(3) and command.group(3).startswith("NAME "):
            yield i + 1, wide, command.group(3).split(), []
        elif line.lstrip().startswith("$") and i + 1 < len(lines) and lines[i + 1].startswith("NAME "):
            rows = []
            for row in lines[i + 2:]:
                if not row.strip() or row.startswith(("$", "```")):
                    break
                rows.append(row.split())
            yield i + 2, wide, lines[i + 1].split(), rows


def prose_column_lists(markdown: str) -> Iterator[tuple[int, list[str]]]:
    """"`kubectl get dtj` shows Mode, Workers, ... and Age." sentences (joined across line breaks)."""
    text = " ".join(prose(markdown).split())
    for m in re.finditer(r"`kubectl get dtj` shows ((?:[A-Za-z]+, )*[A-Za-z]+ and [A-Za-z]+)", text):
        yield m.start(), re.split(r", | and ", m.group(1))


def named_columns(markdown: str) -> list[str]:
    """Columns named as such in prose: "column `DISRUPTIONS`"."""
    return re.findall(r"columns? `([A-Z][A-Z0-9_-]*)`", " ".join(prose(markdown).split()))


def column_problems(markdown: str) -> list[str]:
    problems = []
    for line, wide, header, rows in column_samples(markdown):
        expected = printer_columns(wide)
        if header != expected:
            problems.append(f"README.md:{line}: shows columns {' '.join(header)}; the CRD's are {' '.join(expected)}")
        problems += [f"README.md:{line}: a row of {len(row)} values under {len(header)} columns: {' '.join(row)}"
                     for row in rows if len(row) != len(header)]  # fmt: skip
    for _, names in prose_column_lists(markdown):
        if [n.upper() for n in names] != printer_columns(False)[1:]:
            problems.append(f"README.md says `kubectl get dtj` shows {', '.join(names)}; "
                            f"the CRD's columns are {', '.join(printer_columns(False)[1:])}")  # fmt: skip
    problems += [f"README.md names a column {name} the CRD lacks" for name in named_columns(markdown)
                 if name not in printer_columns(True)]  # fmt: skip
    return problems


def test_every_column_sample_in_the_readme_is_the_crds() -> None:
    markdown = README.read_text()
    samples = list(column_samples(markdown))
    assert len(samples) >= 2 and list(prose_column_lists(markdown)), "the finders found no `kubectl get dtj` table"
    assert not column_problems(markdown), "\n".join(column_problems(markdown))


def test_the_column_finder_on_planted_text() -> None:
    current = " ".join(printer_columns(False))
    text = (f"```sh\nkubectl get dtj -w   # NAME MODE WORKERS PHASE STEP COMM RESTARTS AGE\n```\n"
            f"```console\n$ kubectl get dtj\n{current}\njob data 2 Running 10\n$ kubectl get dtj j -o yaml\n```\n"
            "`kubectl get dtj` shows Mode, Phase and Age; column `GPUS` with `-o wide`.\n")  # fmt: skip
    problems = column_problems(text)
    assert len(problems) == 4, problems
    assert "README.md:2: shows columns NAME MODE WORKERS PHASE STEP COMM RESTARTS AGE" in problems[0]
    assert "a row of 5 values" in problems[1] and "shows Mode, Phase, Age" in problems[2] and "GPUS" in problems[3]


# ---------------------------------------------------------------------------------------- field paths


def chart_value(path: str) -> bool:
    """Whether `path` names a value of the Helm chart (values.yaml): the chart's `metrics` block
    shares its name with the spec's."""
    node: Any = yaml.safe_load(CHART_VALUES.read_text())
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def field_paths(markdown: str, top_level: set[str]) -> list[str]:
    """Dotted spec/status field paths named in the prose's code spans (see the module docstring)."""
    found = []
    for span in re.findall(r"`([^`\n]+)`", prose(markdown)):
        for path in PATH_IN_SPAN.findall(span):
            parts = path.split(".")
            if parts[0] == "dtj":  # `kubectl explain dtj.spec.workers`
                parts = parts[1:]
            if parts[0] in ("spec", "status") and len(parts) > 1:
                found.append(".".join(parts))
            elif parts[0] in top_level and parts[-1] not in FILE_EXTENSIONS and not chart_value(path):
                found.append("spec." + ".".join(parts))
    return found


def resolves(schema: dict[str, Any], path: str) -> bool:
    """Whether `path` (spec.a.b) names a field of the schema: through properties, array items,
    maps (additionalProperties) and, below an object that keeps unknown fields, anything."""
    node = schema
    for part in path.split("."):
        while "items" in node:  # a list's elements' fields: `workers.template.containers.image`
            node = node["items"]
        props = node.get("properties") or {}
        if part in props:
            node = props[part]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        elif node.get("x-kubernetes-preserve-unknown-fields") and not props:
            return True
        else:
            return False
    return True


def unknown_field_paths(markdown: str) -> list[str]:
    schema = _schema()
    top = set(schema["properties"]["spec"]["properties"])
    return sorted({p for p in field_paths(markdown, top) if not resolves(schema, p)})


def test_every_field_path_the_readme_names_exists() -> None:
    schema = _schema()
    paths = field_paths(README.read_text(), set(schema["properties"]["spec"]["properties"]))
    assert len(set(paths)) >= 40, f"too few field paths found; the finder is broken: {sorted(set(paths))}"
    missing = unknown_field_paths(README.read_text())
    assert not missing, f"README.md names fields the CRD's schema lacks: {missing}"


def test_the_field_path_finder_on_planted_text() -> None:
    text = ("Set `training.steps` (and `spec.checkpoint.intervalSteps`), `data.format: tokens`, "
            "`workers.replicas x workers.procsPerWorker`, `kubectl explain dtj.spec.workers`, "
            "`status.progress.eta`, `status.result.anything` (kept as written).\n"
            "Not fields: `model.safetensors`, `summary.json`, `metrics.podMonitor.enabled=true`, "
            "`metrics.podMonitor.enabled` (the chart's), "
            "`model.name 'pkg.mod:make'`, `nn.Module`, `s3://bucket/data.tar`, `torch.distributed.checkpoint`.\n"
            "Wrong: `training.stepz`, `spec.checkpoint.retainForever`, `status.commFractions`, `data.format.kind`, "
            "`metrics.portz`.\n"
            "```yaml\n# spec.made.up in a code block is an example's, not prose\n```\n")  # fmt: skip
    schema = _schema()
    top = set(schema["properties"]["spec"]["properties"])
    assert field_paths(text, top) == [
        "spec.training.steps", "spec.checkpoint.intervalSteps", "spec.data.format", "spec.workers.replicas",
        "spec.workers.procsPerWorker", "spec.workers", "status.progress.eta", "status.result.anything",
        "spec.model.name", "spec.training.stepz", "spec.checkpoint.retainForever", "status.commFractions",
        "spec.data.format.kind", "spec.metrics.portz",
    ]  # fmt: skip
    assert unknown_field_paths(text) == ["spec.checkpoint.retainForever", "spec.data.format.kind",
                                         "spec.metrics.portz", "spec.training.stepz", "status.commFractions"]  # fmt: skip
