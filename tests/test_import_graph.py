"""The project's import graph (function-level imports included): no cycles; pretrain and finetune never import
each other; the runtime imports no task; modeling imports no I/O, distributed or tracking code. Modules are
named as installed: the folder modeling/ is `hibert.modeling` (pyproject's package-dir)."""
import ast
from pathlib import Path

from conftest import REPO

PACKAGES = ("hibert", "modeling", "data_prep", "pretrain", "finetune", "slurm", "configs")
NOT_IN_MODELING = {"torch.distributed", "deepspeed", "mlflow", "safetensors", "hibert.data_prep", "hibert.runtime",
                   "hibert.registry", "sentencepiece", "stanza", "datasets", "hibert.pretrain", "hibert.finetune",
                   "hibert.slurm"}


def _package(module: str) -> str:
    """The layer a module belongs to: its folder (hibert.modeling.x -> modeling; hibert.runtime.x -> hibert)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "hibert" and parts[1] in PACKAGES else parts[0]


def _modules() -> dict[str, Path]:
    mods = {}
    for top in PACKAGES:
        for p in (REPO / top).rglob("*.py"):
            parts = list(p.relative_to(REPO).with_suffix("").parts)
            parts = parts[:-1] if parts[-1] == "__init__" else parts
            mods[".".join(parts if top == "hibert" else ["hibert", *parts])] = p
    return mods


def _imports(path: Path, module: str, mods: dict[str, Path]) -> set[str]:
    """What a module imports: `from pkg import sub` counts as importing pkg.sub (not pkg) when sub is a module."""
    base = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = base.split(".")[: len(base.split(".")) - node.level + 1] if node.level else []
            pre = ".".join(parts + ([node.module] if node.module else []))
            subs = {f"{pre}.{a.name}" for a in node.names if f"{pre}.{a.name}" in mods}
            out |= subs if len(subs) == len(node.names) else subs | {pre}
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    return {m: {r for n in _imports(p, m, mods) if (r := resolve(n)) and r != m} for m, p in mods.items()}, mods


def test_no_import_cycles():
    graph, mods = _graph()
    index, low, stack, on, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while (w := stack.pop()) != v:
                on.discard(w)
                comp.append(w)
            on.discard(v)
            comp.append(v)
            if sum(mods[c].name != "__init__.py" for c in comp) > 1:
                cycles.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_layering():
    graph, mods = _graph()
    bad = []
    for m, deps in graph.items():
        top = _package(m)
        for d in deps:
            dtop = _package(d)
            if {top, dtop} == {"pretrain", "finetune"}:
                bad.append(f"{m} -> {d} (pretrain and finetune are independent tasks)")
            if m.startswith("hibert.runtime") and dtop in ("pretrain", "finetune"):
                bad.append(f"{m} -> {d} (the runtime imports no task)")
    for m, p in mods.items():
        if _package(m) != "modeling":
            continue
        for name in _imports(p, m, mods):
            if any(name == x or name.startswith(x + ".") for x in NOT_IN_MODELING):
                bad.append(f"{m} imports {name} (modeling/ is pure nn.Module code)")
    assert not bad, "\n".join(bad)


# the code every head goes through: it asks the head registry (hibert/heads.py), never a head's folder or name
GENERIC = ("hibert/cli.py", "hibert/config", "finetune/cli.py", "finetune/corpus_cli.py", "finetune/settings.py",
           "finetune/serving", "finetune/base", "finetune/evaluation", "finetune/inference", "slurm")
BUILTIN_HEADS = ("extractive", "abstractive", "ranker", "mds")
# objective.kind's legacy values: configs written before finetune.task named the head set it to a head's name
NAMES_ALLOWED = {"hibert/config/training.py": "_legacy_head_kind"}


def test_generic_code_names_no_head():
    """No import of a head's folder (hibert.finetune.<head>), and no head's name compared against or looked up
    (`head.name == "extractive"`, `heads["mds"]`): a new head is a plug-in, not an edit of these files."""
    graph, mods = _graph()
    bad = []
    for m, p in mods.items():
        rel = p.relative_to(REPO).as_posix()
        if not any(rel == g or rel.startswith(g + "/") for g in GENERIC):
            continue
        bad += [f"{rel} imports {d}" for d in graph[m]
                if any(d == f"hibert.finetune.{h}" or d.startswith(f"hibert.finetune.{h}.") for h in BUILTIN_HEADS)]
        tree = ast.parse(p.read_text(encoding="utf-8"))
        allowed = {id(n) for f in ast.walk(tree) if isinstance(f, ast.FunctionDef) and f.name == NAMES_ALLOWED.get(rel)
                   for n in ast.walk(f)}
        for node in ast.walk(tree):
            if id(node) in allowed:
                continue
            consts = []
            if isinstance(node, ast.Compare):
                consts = [node.left, *node.comparators]
            elif isinstance(node, ast.Subscript):
                consts = [node.slice]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "get" and node.args:
                consts = [node.args[0]]
            for c in consts:
                names = c.elts if isinstance(c, (ast.Tuple, ast.List, ast.Set)) else [c]
                bad += [f"{rel}:{node.lineno} names the head {n.value!r}" for n in names
                        if isinstance(n, ast.Constant) and n.value in BUILTIN_HEADS]
    assert not bad, "\n".join(bad)
