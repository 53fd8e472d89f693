"""Rules of the package's shape: its import graph has no loops (every import of a segood module, at module level or
inside a function, is an edge, and no module reaches itself), and every compiled kernel releases the GIL."""

import ast
from pathlib import Path

import segood

ROOT = Path(segood.__file__).parent


def modules():
    """{dotted name: path} of every module of the package (a package is its ``__init__``)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(name, path, known):
    """The segood modules ``name`` imports anywhere in its code (``from package import submodule`` is an edge
    to the submodule, ``from package import name`` to the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    edges = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + [base] * bool(base))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        else:
            continue
        edges.update(t for t in targets if t in known and t != name)
    return edges


def cycles(graph):
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_the_cycle_finder_finds_a_planted_loop():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_through_others():
    known = modules()
    graph = {name: imports(name, path, known) for name, path in known.items()}
    assert "segood.methods.methods" in graph["segood.methods"]  # the graph is read, not empty
    assert cycles(graph) == []


def compiled_kernels(tree):
    """[(name, keywords {name: literal value})] of the functions ``tree`` decorates with ``numba.njit(...)``."""
    found = []
    for node in ast.walk(tree):
        for decorator in getattr(node, "decorator_list", []):
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) in ("numba.njit", "njit", "numba.jit"):
                found.append((node.name, {k.arg: ast.literal_eval(k.value) for k in decorator.keywords}))
    return found


def test_every_compiled_kernel_releases_the_gil():
    """A kernel called from the update thread (the per-image bookkeeping on CUDA) or the saver must leave the GIL to
    the main thread, which starts the next batch's network meanwhile; inlined helpers never run on their own."""
    planted = ast.parse("@numba.njit(cache=True)\ndef f(x):\n    return x\n")
    assert compiled_kernels(planted) == [("f", {"cache": True})]
    kernels = {f"{name}.{kernel}": keywords for name, path in modules().items()
               for kernel, keywords in compiled_kernels(ast.parse(path.read_text()))}
    assert "segood.metrics._kernels.builtin_metrics" in kernels  # the kernels are read, not none
    holding = [name for name, keywords in kernels.items()
               if not keywords.get("nogil") and keywords.get("inline") != "always"]
    assert holding == []
