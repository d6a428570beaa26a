"""Layering rules that code review alone would let slip."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB_AND_QUEUE = {"fastapi", "starlette", "celery", "kombu", "uvicorn"}
COMPOSITION_ROOT = ROOT / "service" / "cli"
CLI_MODULES = sorted(COMPOSITION_ROOT.rglob("*.py"))


def _imports(tree: ast.AST, *, top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only and isinstance(tree, ast.Module) else ast.walk(tree)
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    "path",
    sorted(p for p in (ROOT / "service").rglob("*.py") if COMPOSITION_ROOT not in p.parents),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_service_imports_neither_the_web_framework_nor_the_queue(path: Path) -> None:
    imported = _imports(ast.parse(path.read_text()), top_level_only=False)
    assert not imported & (WEB_AND_QUEUE | {"api", "tasks", "scheduler"})


@pytest.mark.parametrize("path", CLI_MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_cli_starts_the_other_layers_only_inside_its_commands(path: Path) -> None:
    imported = _imports(ast.parse(path.read_text()), top_level_only=True)
    assert not imported & (WEB_AND_QUEUE | {"api", "tasks", "scheduler"})


def test_the_api_never_touches_rows_without_the_service_layer() -> None:
    for path in (ROOT / "api").rglob("*.py"):
        source = path.read_text()
        assert "session.add(" not in source and "session.execute(" not in source, path


SERVICE = ROOT / "service"
# The concerns of service/, lowest first: a module imports its own package and those before it,
# never one after it. Each package's docstring says what it owns.
PACKAGE_ORDER = (
    "platform",
    "language",
    "actions",
    "catalogue",
    "engine",
    "triggers",
    "alerts",
    "cli",
)


def _service_packages(tree: ast.AST) -> set[str]:
    """The packages of ``service`` a module names, at import time or inside a function."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            dotted = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            dotted = [node.module]
            if node.module == "service":
                dotted = [f"service.{alias.name}" for alias in node.names]
        else:
            continue
        names |= {name.split(".")[1] for name in dotted if name.startswith("service.")}
    return {name for name in names if (SERVICE / name).is_dir()}


def _package_of(path: Path) -> str | None:
    parts = path.relative_to(SERVICE).parts
    return parts[0] if len(parts) > 1 else None


@pytest.mark.parametrize(
    "path",
    sorted(p for p in SERVICE.rglob("*.py") if _package_of(p) is not None),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_service_packages_import_only_their_own_and_those_below(path: Path) -> None:
    own = _package_of(path)
    assert own in PACKAGE_ORDER, f"{own} is not placed in PACKAGE_ORDER"
    allowed = set(PACKAGE_ORDER[: PACKAGE_ORDER.index(own) + 1])
    assert _service_packages(ast.parse(path.read_text())) <= allowed


@pytest.mark.parametrize("package", PACKAGE_ORDER)
def test_every_service_package_says_what_it_owns(package: str) -> None:
    init = SERVICE / package / "__init__.py"
    assert ast.get_docstring(ast.parse(init.read_text())), init


def test_service_holds_packages_only() -> None:
    """A module of ``service/`` belongs to one concern; a new one goes into its package."""
    loose = sorted(p.name for p in SERVICE.glob("*.py") if p.name != "__init__.py")
    assert not loose


PROCESS_APP = "tasks.app"


def _top_level_modules(path: Path) -> set[str]:
    """Dotted names a module imports when it is loaded (``from a import b`` counts ``a.b`` too,
    since ``b`` may be a submodule)."""
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _source(module: str) -> Path | None:
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _loads_on_import(path: Path) -> set[str]:
    seen: set[str] = set()
    pending = list(_top_level_modules(path))
    while pending:
        module = pending.pop()
        source = _source(module)
        if module in seen or source is None:
            continue
        seen.add(module)
        pending.extend(_top_level_modules(source))
    return seen


@pytest.mark.parametrize(
    "path",
    sorted((ROOT / "tests").rglob("*.py")),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_no_test_module_builds_the_celery_app_when_collected(path: Path) -> None:
    """``tasks.app`` configures the process-wide Celery app from the environment at import.
    Imported while pytest collects, before the test stack sets the broker URL, it would point
    every worker at a shared default Redis DB, where parallel test runs steal each other's
    messages. Tests import it inside the test, after the stack is up."""
    assert PROCESS_APP not in _loads_on_import(path)
