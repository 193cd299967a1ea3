"""The layout docs/layout.md draws holds in the code (issue 16): which package may import
which, and no import cycle among the product's modules, counting the imports inside
functions too (a function-level import does not make a cycle go away, it only hides it).

Read from the source with ``ast``; nothing is imported.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("spec", "oracle", "impl", "conformance", "gdpo_tools", "benchmarks")

#: What each package may import of the others (itself always). spec depends on nothing of the
#: project; the oracle judges independently of the implementation it judges; the drop-in
#: stays torch and the standard library; the grader never needs the tools built on it.
MAY_IMPORT = {
    "spec": set(),
    "oracle": {"spec"},
    # impl's certificate (impl/_certify/) decides what double-double cannot in exact arithmetic,
    # the oracle's (imported where that tier runs); nothing else of impl reads the oracle
    "impl": {"spec", "oracle"},
    "conformance": {"spec", "oracle", "impl"},
    "gdpo_tools": {"spec", "oracle", "impl", "conformance"},
    "benchmarks": {"spec", "oracle", "impl", "gdpo_tools"},
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            rel = path.relative_to(ROOT).with_suffix("")
            parts = list(rel.parts)
            if parts[-1].startswith("test_") or parts[-1] == "conftest":
                continue  # tests are not product code
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _resolve(name: str) -> str | None:
    """The project module an imported name lands in (a package's ``__init__`` for a package)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            # `from pkg import sub` lands in pkg.sub (a submodule), `from pkg import name` in pkg
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        for name in names:
            target = _resolve(name)
            if target is not None and target != module:
                found.add(target)
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (parsed when a test first asks, not at collection)."""
    return {m: _imports(m, p) for m, p in MODULES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_layout_is_read_from_the_whole_tree():
    assert {"spec.errors", "oracle.gdpo", "impl.gdpo", "conformance.properties", "gdpo_tools.cli",
            "gdpo_tools.limits.generate", "gdpo_tools.peer_formulas"} <= set(MODULES)
    assert "conformance.properties" in _graph()["conformance.grading"]  # imports are seen


def test_no_import_cycles_among_the_products_modules():
    cycles = _cycles(_graph())
    shown = ["; ".join(f"{a} -> {b}" for a in c for b in sorted(_graph()[a]) if b in c) for c in cycles]
    assert not cycles, "import cycles (function-level imports counted):\n  " + "\n  ".join(shown)


def test_each_package_imports_only_what_the_layout_allows():
    wrong = [f"{m} imports {t}" for m, targets in sorted(_graph().items()) for t in sorted(targets)
             if t.split(".")[0] != m.split(".")[0] and t.split(".")[0] not in MAY_IMPORT[m.split(".")[0]]]
    assert not wrong, "imports against the layout (tests/test_layout.py MAY_IMPORT):\n  " + "\n  ".join(wrong)


#: impl's spine (docs/architecture.md): the stages receive the plan as an argument and never reach
#: the orchestration (the plan and the local spine, the distributed protocol, the entry points),
#: not even to name a type; Eq. 4, 7 and 6 never reach the certificate (it
#: reads their results, handed over by the spine); and the local spine never reaches the protocol
#: (impl.gdpo dispatches to both; the protocol runs the spine's stages).
IMPL_STAGES = ("_inputs", "_eq47", "_whiten", "_certify", "_certify.tiers", "_certify.bounds",
               "_certify.exact", "_certify.dd")
IMPL_ORCHESTRATION = ("_pipeline", "_distributed", "gdpo", "adapters")
IMPL_ARITHMETIC = ("_eq47", "_whiten")


def _reach(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for m in graph.get(todo.pop(), ()):
            if m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def _spine_breaches(graph: dict[str, set[str]]) -> list[str]:
    def impl(names):
        return {f"impl.{n}" for n in names}
    rules = [(m, impl(IMPL_ORCHESTRATION)) for m in IMPL_STAGES]
    rules += [(m, impl(["_certify", "_certify.tiers", "_certify.bounds", "_certify.exact", "_certify.dd"]))
              for m in IMPL_ARITHMETIC]
    rules += [("_pipeline", impl(["_distributed"]))]
    return [f"impl.{m} reaches {t}" for m, banned in rules for t in sorted(_reach(graph, f"impl.{m}") & banned)]


def test_impls_stages_never_reach_the_plan_the_spine_or_the_protocol():
    assert set(IMPL_STAGES + IMPL_ORCHESTRATION) <= {m.split(".", 1)[1] for m in MODULES if m.startswith("impl.")}
    wrong = _spine_breaches(_graph())
    assert not wrong, "imports against impl's spine (docs/architecture.md):\n  " + "\n  ".join(wrong)


def test_the_spine_rule_finds_a_stage_that_imports_the_plan_through_another():
    """Negative control: a stage that reaches the plan through another module breaks the rule."""
    graph = {m: set(t) for m, t in _graph().items()}
    graph["impl._whiten"] = graph["impl._whiten"] | {"impl._eq47"}
    graph["impl._eq47"] = graph["impl._eq47"] | {"impl._pipeline"}
    assert "impl._whiten reaches impl._pipeline" in _spine_breaches(graph)


def test_the_cycle_finder_finds_a_cycle_hidden_in_a_function():
    """Negative control: a cycle made only by a function-level import is found."""
    src = {"a": "import b\n", "b": "def f():\n    import a\n"}
    graph = {}
    for name, text in src.items():
        graph[name] = {n.names[0].name for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Import)}
    assert _cycles(graph) == [["a", "b"]]


def test_the_grader_holds_no_command_line_audit_or_limits_code():
    names = {m.split(".")[-1] for m in MODULES if m.startswith("conformance.")}
    assert not names & {"cli", "audit", "limits", "mirrors", "document"}, names
    assert not any(n.startswith("limits") for n in names), names
