"""What reached Thunder of a model composed with PyTorch's parallelism: ThunderFX's own report
(``ThunderCompiler.subgraph_infos``: the graphs Dynamo handed it, what Thunder compiled of each
and why it split them), Dynamo's graph breaks (``torch._dynamo.utils.counters``) and, under
``thunder.jit``, the jitted modules that ran. Read from Thunder's and torch's reports, never from
printed traces."""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch import nn

from conformance.checks.record import ReachedThunder


def graph_breaks() -> Counter[str]:
    """Dynamo's graph breaks so far in this process, by reason."""
    from torch._dynamo.utils import counters

    return Counter(dict(counters["graph_break"]))


def reached_thunder(under_test: Any, breaks_before: Counter[str]) -> ReachedThunder:
    """What Thunder compiled of ``under_test`` (a ``fixtures.torch_parallel.UnderTest``) since
    ``breaks_before`` was read."""
    import thunder

    breaks = graph_breaks() - breaks_before
    compiler = under_test.compiler
    if compiler is not None:
        infos = compiler.subgraph_infos
        compiled = sum(len(i.thunder_compiled_fns or ()) for i in infos)
        splits = [_split(r) for i in infos for r in i.split_reasons or ()]
        eager = sum(1 for i in infos if not i.thunder_compiled_fns)
        return ReachedThunder(compiled, eager, splits, dict(breaks), _ops_by_compiler(infos))
    jitted = [m for m in (under_test.call, *_modules(under_test.model)) if thunder.compile_data(m) is not None]
    ran = sum(1 for m in dict.fromkeys(jitted) if thunder.last_traces(m))
    return ReachedThunder(ran, 0, [], dict(breaks))


def _ops_by_compiler(infos: list[Any]) -> dict[str, dict[str, int]]:
    """Per compiler ThunderFX handed a piece of a captured graph to (its own report,
    ``submodule_to_compiled_functions``), the ops those pieces call, counted by name."""
    out: dict[str, Counter[str]] = {}
    for info in infos:
        for piece, compiled in (getattr(info, "submodule_to_compiled_functions", None) or {}).items():
            ops = out.setdefault(getattr(compiled.compiler, "name", str(compiled.compiler)), Counter())
            for node in piece.graph.nodes:
                if node.op == "call_function":
                    ops[getattr(node.target, "__name__", str(node.target))] += 1
    return {compiler: dict(ops) for compiler, ops in out.items()}


def _modules(model: nn.Module) -> list[nn.Module]:
    return [m for _, m in model.named_modules()]


def _split(reason: Any) -> str:
    kind = getattr(reason.reason_type, "name", str(reason.reason_type))
    # ThunderFX's info may only point at its exception ("see exception field"): both are kept
    detail = " ".join(str(d) for d in (reason.info, reason.exception) if d) or "(no detail)"
    return f"{kind}: {detail}"
