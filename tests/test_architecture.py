"""Layering rules that code review alone would let slip."""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WEB_AND_QUEUE = {"fastapi", "starlette", "celery", "kombu", "uvicorn"}
COMPOSITION_ROOT = ROOT / "service" / "cli.py"


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
    sorted(p for p in (ROOT / "service").rglob("*.py") if p != COMPOSITION_ROOT),
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_service_imports_neither_the_web_framework_nor_the_queue(path: Path) -> None:
    imported = _imports(ast.parse(path.read_text()), top_level_only=False)
    assert not imported & (WEB_AND_QUEUE | {"api", "tasks", "scheduler"})


def test_the_cli_starts_the_other_layers_only_inside_its_commands() -> None:
    imported = _imports(ast.parse(COMPOSITION_ROOT.read_text()), top_level_only=True)
    assert not imported & (WEB_AND_QUEUE | {"api", "tasks", "scheduler"})


def test_the_api_never_touches_rows_without_the_service_layer() -> None:
    for path in (ROOT / "api").rglob("*.py"):
        source = path.read_text()
        assert "session.add(" not in source and "session.execute(" not in source, path
