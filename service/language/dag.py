"""Dependency-graph helpers for profile steps.

Kept free of pydantic and YAML so validation, the engine and the API can all share one notion
of "what runs before what" without import cycles.
"""

from collections.abc import Collection, Mapping


class CycleError(ValueError):
    """The graph has a cycle; ``cycle`` lists it closed, e.g. ``["a", "b", "a"]``."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__("dependency cycle: " + " -> ".join(cycle))
        self.cycle = cycle


class UnknownDependency(ValueError):
    """A node depends on a name that is not a node of the graph."""

    def __init__(self, node: str, missing: str) -> None:
        super().__init__(f"{node!r} depends on unknown node {missing!r}")
        self.node = node
        self.missing = missing


def _check_known(deps: Mapping[str, Collection[str]]) -> None:
    for node, node_deps in deps.items():
        for dep in node_deps:
            if dep not in deps:
                raise UnknownDependency(node, dep)


def find_cycle(deps: Mapping[str, Collection[str]]) -> list[str] | None:
    """Return one cycle (closed list) if the graph has any, searching nodes in input order."""
    _check_known(deps)
    done: set[str] = set()
    for start in deps:
        if start in done:
            continue
        path: list[str] = []
        on_path: set[str] = set()
        stack: list[tuple[str, list[str]]] = [(start, list(deps[start]))]
        path.append(start)
        on_path.add(start)
        while stack:
            node, pending = stack[-1]
            if not pending:
                stack.pop()
                path.pop()
                on_path.discard(node)
                done.add(node)
                continue
            nxt = pending.pop(0)
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                stack.append((nxt, list(deps[nxt])))
                path.append(nxt)
                on_path.add(nxt)
    return None


def topological_layers(deps: Mapping[str, Collection[str]]) -> list[list[str]]:
    """Group nodes into layers that can run in parallel, each layer after all of its deps.

    A node's layer is one more than the deepest of its dependencies; within a layer nodes keep
    the mapping's order so that the result is deterministic for a given profile.
    """
    cycle = find_cycle(deps)
    if cycle is not None:
        raise CycleError(cycle)
    level: dict[str, int] = {}
    for node in deps:
        _fill_levels(deps, node, level)
    layers: list[list[str]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for node in deps:
        layers[level[node]].append(node)
    return layers


def _fill_levels(deps: Mapping[str, Collection[str]], root: str, level: dict[str, int]) -> None:
    """Fill ``level`` bottom-up without recursion, so long chains cannot hit the stack limit."""
    stack = [root]
    while stack:
        node = stack[-1]
        if node in level:
            stack.pop()
            continue
        todo = [d for d in deps[node] if d not in level]
        if todo:
            stack.extend(todo)
            continue
        level[node] = 1 + max((level[d] for d in deps[node]), default=-1)
        stack.pop()


def ancestors(deps: Mapping[str, Collection[str]], node: str) -> set[str]:
    """Every node that ``node`` depends on, directly or transitively (never ``node`` itself
    unless it sits on a cycle)."""
    seen: set[str] = set()
    stack = list(deps.get(node, ()))
    while stack:
        current = stack.pop()
        if current in seen:
            continue
        seen.add(current)
        stack.extend(deps.get(current, ()))
    return seen


def descendants(deps: Mapping[str, Collection[str]], node: str) -> set[str]:
    """Every node that depends on ``node``, directly or transitively."""
    seen: set[str] = set()
    frontier = {node}
    while frontier:
        frontier = {other for other, its in deps.items() if frontier & set(its)} - seen
        seen |= frontier
    return seen
