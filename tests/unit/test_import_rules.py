"""The import rules of the four packages, checked on the source (every import statement, including
ones inside functions and under TYPE_CHECKING) and once more by importing the API and the CLI in a
fresh interpreter.

Between packages (ALLOWED): API <- operator, API <- trainer, API/operator/trainer launcher <- CLI.
Inside the trainer: a mode (disttrain_trainer.modes.<mode>) imports no other mode; the shared
services (everything outside modes/) import no mode; only __main__ imports the dispatch table.
Everywhere: no module imports a module that imports it back, directly or around a longer cycle;
an import inside a function defers a heavy dependency and says which (`# noqa: PLC0415 - <dep>`).
Inside the trainer, the same holds one level up: no top-level package or module
(disttrain_trainer.process, .checkpoints, .data, .models, ...) imports one that imports it back,
even when no two of their modules form a cycle (low-level packages hold primitives, not a rank's
assembly of data, model and metrics).

`violations(tree)` checks a source tree; the tests below run it on this checkout and on copies
with one violation planted each, which it must report.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# package -> its folder, relative to the repository root
PACKAGES = {
    "disttrain_api": "operator/disttrain_api",
    "disttrain_operator": "operator/disttrain_operator",
    "disttrain_trainer": "trainer/disttrain_trainer",
    "disttrain_cli": "cli/disttrain_cli",
}
# Which packages each package may import (besides itself), and which of their modules: a prefix.
ALLOWED = {
    "disttrain_api": (),
    "disttrain_operator": ("disttrain_api",),
    "disttrain_trainer": ("disttrain_api",),
    "disttrain_cli": ("disttrain_api", "disttrain_operator", "disttrain_trainer.launcher"),
}
TRAINER = "disttrain_trainer"
MODES = "disttrain_trainer.modes"
TRAINER_ENTRY = "disttrain_trainer.__main__"  # the one module outside modes/ that reaches them (the table)
# Beyond the standard library, the API may import only PyYAML: the CLI and both images use it.
API_THIRD_PARTY = ("yaml",)
HEAVY = ("torch", "kopf", "kubernetes", "grpc", "numpy", "prometheus_client", "cryptography", "matplotlib")
DEFERRED_MARK = "noqa: PLC0415 - "


@dataclass(frozen=True)
class Import:
    source: str  # importing module
    target: str  # imported module (a name imported from a module counts as that module)
    line: int
    deferred: bool  # inside a function
    text: str  # the statement's first and last source lines (where its comment is)


def _module_name(package: str, folder: Path, path: Path) -> str:
    parts = [package, *path.relative_to(folder).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules(tree: Path) -> dict[str, Path]:
    found = {}
    for package, rel in PACKAGES.items():
        folder = tree / rel
        for path in sorted(folder.rglob("*.py")):
            if "_pb2" not in path.name:  # generated gRPC stubs
                found[_module_name(package, folder, path)] = path
    return found


def _imports(module: str, path: Path, known: set[str]) -> list[Import]:
    source = path.read_text()
    lines = source.splitlines()
    tree = ast.parse(source, filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: list[Import] = []

    def add(node: ast.stmt, target: str, deferred: bool) -> None:
        text = lines[node.lineno - 1] + "\n" + lines[(node.end_lineno or node.lineno) - 1]
        out.append(Import(module, target, node.lineno, deferred, text))

    def visit(node: ast.AST, deferred: bool) -> None:
        for child in ast.iter_child_nodes(node):
            inner = deferred or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
            if isinstance(child, ast.Import):
                for alias in child.names:
                    add(child, alias.name, inner)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    add(child, sub if sub in known else base, inner)
            visit(child, inner)

    visit(tree, False)
    return out


def _package(module: str) -> str:
    return module.split(".")[0]


def _in(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def _mode(module: str) -> str | None:
    """The mode package a module belongs to (disttrain_trainer.modes.<mode>), else None."""
    parts = module.split(".")
    return ".".join(parts[:3]) if _in(module, MODES) and len(parts) > 2 else None


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1 or v in edges.get(v, ()):
                found.append(sorted(scc))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


def _trainer_unit(module: str) -> str | None:
    """The trainer's top-level package or module that `module` belongs to (disttrain_trainer.X), else None."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == TRAINER and len(parts) > 1 else None


def violations(tree: Path) -> list[str]:
    """Every broken rule in the source tree rooted at `tree`, one line each."""
    modules = _modules(tree)
    known = set(modules)
    stdlib = set(sys.stdlib_module_names)
    bad: list[str] = []
    edges: dict[str, set[str]] = {}
    unit_edges: dict[str, set[str]] = {}
    for module, path in modules.items():
        for imp in _imports(module, path, known):
            where = f"{path.relative_to(tree)}:{imp.line}: {module} imports {imp.target}"
            src, dst = _package(module), _package(imp.target)
            if dst in PACKAGES:
                if dst != src and not any(_in(imp.target, p) for p in ALLOWED[src]):
                    bad.append(f"{where}: {src} may import only {', '.join(ALLOWED[src]) or 'the standard library'}")
                if _mode(imp.target) and _mode(module) and _mode(imp.target) != _mode(module):
                    bad.append(f"{where}: a mode imports another mode")
                if _in(imp.target, MODES) and not _in(module, MODES) and module != TRAINER_ENTRY:
                    bad.append(f"{where}: a shared service imports a mode")
                if module == TRAINER_ENTRY and _mode(imp.target):
                    bad.append(f"{where}: the entry reaches a mode only through the table (modes/__init__.py)")
                if imp.target in known and imp.target != module:
                    edges.setdefault(module, set()).add(imp.target)
                a, b = _trainer_unit(module), _trainer_unit(imp.target)
                if a and b and a != b:
                    unit_edges.setdefault(a, set()).add(b)
            elif src == "disttrain_api" and dst not in stdlib and dst not in API_THIRD_PARTY and dst != "__future__":
                bad.append(f"{where}: the API imports only the standard library and {', '.join(API_THIRD_PARTY)}")
            if imp.deferred and DEFERRED_MARK not in imp.text:
                bad.append(f"{where}: inside a function; defer only a heavy dependency and name it "
                           f"(`# {DEFERRED_MARK}<dependency>`), else import it at the top")
    for cycle in _cycles(edges):
        bad.append(f"import cycle: {' <-> '.join(cycle)}")
    for cycle in _cycles(unit_edges):
        bad.append(f"package cycle in the trainer: {' <-> '.join(cycle)}")
    return list(dict.fromkeys(bad))  # one line per statement and rule (`from m import a, b` is one)


def test_the_checkout_keeps_every_import_rule() -> None:
    found = violations(ROOT)
    assert not found, "\n".join(found)


def _copy(tmp_path: Path) -> Path:
    for rel in PACKAGES.values():
        shutil.copytree(ROOT / rel, tmp_path / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _plant(tree: Path, rel: str, text: str) -> None:
    path = tree / rel
    path.write_text(path.read_text() + "\n" + text + "\n")


PLANTED = {
    "mode imports mode": (
        "trainer/disttrain_trainer/modes/federated/entry.py",
        "from ..data import layouts",
        "disttrain_trainer.modes.federated.entry imports disttrain_trainer.modes.data.layouts: a mode imports another mode",
    ),
    "service imports a mode": (
        "trainer/disttrain_trainer/run_common.py",
        "from .modes.pipeline.loop import run_to_end",
        "disttrain_trainer.run_common imports disttrain_trainer.modes.pipeline.loop: a shared service imports a mode",
    ),
    "operator imports the trainer": (
        "operator/disttrain_operator/reconcile.py",
        "from disttrain_trainer.process.config import TrainerConfig",
        "disttrain_operator.reconcile imports disttrain_trainer.process.config: disttrain_operator may import only",
    ),
    "operator imports the CLI": (
        "operator/disttrain_operator/settings.py",
        "import disttrain_cli",
        "disttrain_operator.settings imports disttrain_cli: disttrain_operator may import only",
    ),
    "API imports torch": (
        "operator/disttrain_api/constants.py",
        "import torch",
        "disttrain_api.constants imports torch: the API imports only the standard library",
    ),
    "CLI imports the trainer beyond its launcher": (
        "cli/disttrain_cli/validate_cmd.py",
        "from disttrain_trainer.modes import entry_for",
        "disttrain_cli.validate_cmd imports disttrain_trainer.modes: disttrain_cli may import only",
    ),
    "two modules import each other": (
        "trainer/disttrain_trainer/checkpoints/fence.py",
        "from . import directory",
        "import cycle: disttrain_trainer.checkpoints.directory <-> disttrain_trainer.checkpoints.fence",
    ),
    "a longer cycle through a deferred import": (
        "trainer/disttrain_trainer/process/config.py",
        "def _late() -> None:\n    from ..data.dataset import Dataset  # noqa: PLC0415 - numpy\n",
        "import cycle: disttrain_trainer.data.dataset <-> ",  # one member of the cycle (listed sorted)
    ),
    "two trainer packages import each other, though no two of their modules do": (
        "trainer/disttrain_trainer/process/precision.py",
        "from ..models import MLP",
        ("package cycle in the trainer: ", "disttrain_trainer.models <-> ", "disttrain_trainer.process"),
    ),
    "a trainer package and a top-level module import each other": (
        "trainer/disttrain_trainer/parallel/mesh.py",
        "from ..collective_rank import Rank",
        ("package cycle in the trainer: ", "disttrain_trainer.collective_rank <-> ", "disttrain_trainer.parallel"),
    ),
    "a deferred import without its reason": (
        "operator/disttrain_operator/observe.py",
        "def _late() -> None:\n    import json  # noqa: PLC0415\n",
        "disttrain_operator.observe imports json: inside a function",
    ),
}


@pytest.mark.parametrize("case", sorted(PLANTED))
def test_a_planted_violation_is_reported(case: str, tmp_path: Path) -> None:
    rel, text, expected = PLANTED[case]
    tree = _copy(tmp_path)
    assert violations(tree) == [], "the copy must start clean"
    _plant(tree, rel, text)
    found = violations(tree)
    needles = expected if isinstance(expected, tuple) else (expected,)  # all of them on one line
    assert any(all(n in line for n in needles) for line in found), f"{case}: expected {expected!r} in:\n" + "\n".join(found)


def test_modes_dispatch_table_names_every_mode_and_its_entry() -> None:
    """The table imports its modes by name (importlib), which the source check cannot see."""
    from disttrain_api.model import Mode
    from disttrain_trainer import modes

    assert set(modes.LOOPS) == set(Mode.__args__)
    for loop, entry in modes.ENTRIES.items():
        module, func = entry.split(":")
        assert (ROOT / PACKAGES["disttrain_trainer"] / "modes" / module.replace(".", "/")).with_suffix(".py").exists()
        assert module.split(".")[0] == loop
        assert f"def {func}(" in (ROOT / PACKAGES["disttrain_trainer"] / "modes" / module.replace(".", "/")).with_suffix(".py").read_text()


def test_importing_the_api_and_cli_loads_nothing_heavy() -> None:
    code = (
        "import sys, disttrain_api.model, disttrain_api.validation, disttrain_api.crd, "
        "disttrain_api.constants, disttrain_api.exitcodes, disttrain_api.metric_names, "
        "disttrain_cli\n"
        "disttrain_cli.build_parser()\n"
        f"print(sorted(m for m in {HEAVY!r} + ('disttrain_trainer',) if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_data_readers_table_names_every_format_and_its_reader() -> None:
    """The data package imports its readers by name (importlib) too: each entry is a module with that
    function, and every format has a reader for local data (object storage falls back to it)."""
    from disttrain_api.model.vocabulary import DataFormat
    from disttrain_trainer.data import loading

    assert {what for what, where in loading.READERS if where == "local"} == {*DataFormat.__args__, "text"}
    for entry in loading.READERS.values():
        module, func = entry.split(":")
        path = (ROOT / PACKAGES["disttrain_trainer"] / "data" / module.replace(".", "/")).with_suffix(".py")
        assert f"def {func}(" in path.read_text(), entry
