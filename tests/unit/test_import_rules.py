"""The import direction: API <- operator, API <- trainer, nothing else between them.

Checked on the source (every import statement, including ones inside functions),
and once more by importing the API in a fresh interpreter and listing what got loaded.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
API = ROOT / "operator" / "disttrain_api"
OPERATOR = ROOT / "operator" / "disttrain_operator"
TRAINER = ROOT / "trainer" / "disttrain_trainer"
# The `disttrain local` command runs the trainer's launcher; it imports it lazily, inside a function.
# `disttrain explain --probe-host` runs its all-reduce probe processes, also inside a function.
LAZY_TRAINER_IMPORTERS = {OPERATOR / "cli" / "local_cmd.py", OPERATOR / "cli" / "explain_cmd.py"}
HEAVY = ("torch", "kopf", "kubernetes", "grpc", "numpy", "prometheus_client")


def _imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level package, at module level?) of every absolute import in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    module_level = {id(n) for n in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(a.name.split(".")[0], id(node) in module_level) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.module.split(".")[0], id(node) in module_level))
    return found


def _sources(folder: Path) -> list[Path]:
    files = sorted(folder.rglob("*.py"))
    assert files, f"no sources under {folder}"
    return files


def test_api_imports_only_stdlib_and_yaml() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: {mod}"
        for p in _sources(API)
        for mod, _ in _imports(p)
        if mod in HEAVY or mod in ("disttrain_operator", "disttrain_trainer")
    ]
    assert not bad, "disttrain_api must import only the standard library and yaml:\n" + "\n".join(bad)


def test_trainer_never_imports_the_operator() -> None:
    bad = [
        f"{p.relative_to(ROOT)}: {mod}"
        for p in _sources(TRAINER)
        for mod, _ in _imports(p)
        if mod == "disttrain_operator"
    ]
    assert not bad, "the trainer imports disttrain_operator:\n" + "\n".join(bad)


def test_operator_imports_the_trainer_only_lazily_from_the_local_command() -> None:
    bad = []
    for p in _sources(OPERATOR):
        for mod, top in _imports(p):
            if mod != "disttrain_trainer":
                continue
            if p not in LAZY_TRAINER_IMPORTERS or top:
                bad.append(f"{p.relative_to(ROOT)}: disttrain_trainer ({'module level' if top else 'lazy'})")
    assert not bad, "the operator imports disttrain_trainer:\n" + "\n".join(bad)


def test_importing_the_api_and_cli_loads_nothing_heavy() -> None:
    code = (
        "import sys, disttrain_api.model, disttrain_api.validation, disttrain_api.crd, "
        "disttrain_api.constants, disttrain_api.exitcodes, disttrain_api.metric_names, "
        "disttrain_operator.cli\n"
        f"print(sorted(m for m in {HEAVY!r} + ('disttrain_trainer',) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
