"""IOS stage candidates in the form the executor runs them, for the timer to measure.

A candidate names its groups by operator numbers; here they become graph nodes, then calls:
each group one generated function (compiled once per node tuple, since the same groups recur
across thousands of candidates), run on the runtime's pinned workers (a full-width group on
the calling thread), all reading the values every node had on the example input.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
from torch import fx

from .codegen import CompiledGroup, compile_group
from .graph import Graph
from .runtime import MergeStage, WorkerSet, run_node

Key = tuple[str, tuple[tuple[str, ...], ...], tuple[int, ...]]  # kind, groups as node names, threads
Call = Callable[[], object]


def example_values(graph: Graph, example_inputs: tuple) -> dict:
    """Every node's output on the example input: the inputs a stage measurement reads."""
    env: dict = {}
    placeholders = [n for n in graph.module.graph.nodes if n.op == "placeholder"]
    env.update(zip(placeholders, example_inputs))
    with torch.inference_mode():
        for node in graph.module.graph.nodes:
            if node.op not in ("placeholder", "output"):
                run_node(graph.module, node, env)
    return env


class StageCandidates:
    """The stage candidates of one graph as calls, on the example's values (`env`). Operators
    are numbered within the part being searched (`offset`: its first operator in the graph)."""

    def __init__(self, graph: Graph, env: dict, workers: WorkerSet, threads: int):
        self.graph, self.env, self.workers, self.threads = graph, env, workers, threads
        self.nodes = {n.name: n for n in graph.module.graph.nodes}
        self.offset = 0
        self._compiled: dict[tuple[fx.Node, ...], CompiledGroup] = {}

    def nodes_of(self, ops, offset: int | None = None) -> list[fx.Node]:
        offset = self.offset if offset is None else offset
        return [self.nodes[name] for op in ops for name in self.graph.ops[offset + op].nodes]

    def named(self, groups: Sequence[Sequence[str]]) -> list[list[fx.Node]]:
        """Groups given by node names (a StagePlan's) as nodes."""
        return [[self.nodes[name] for name in group] for group in groups]

    def key(self, kind: str, groups, split) -> Key:
        """The candidate's name in a CostTable: the same at every batch size."""
        return kind, tuple(tuple(n.name for n in self.nodes_of(g)) for g in groups), tuple(split)

    def group(self, ops, offset: int | None = None) -> Call:
        """The operators as one group, run on the calling thread."""
        return self._group_call(self.nodes_of(ops, offset))

    def _group_call(self, nodes: Sequence[fx.Node]) -> Call:
        key = tuple(nodes)
        if key not in self._compiled:
            self._compiled[key] = compile_group(self.graph.module, key)
        compiled = self._compiled[key]
        return lambda: compiled.run(self.env)

    def on_workers(self, calls: Sequence[Call], split: Sequence[int]) -> Call:
        """The calls run at once, calls[i] on split[i] threads, as the executor runs a stage."""
        return lambda: self.workers.run(calls, split)

    def stage(self, kind: str, node_groups: Sequence[Sequence[fx.Node]], split) -> Call | None:
        """The stage as the executor runs it, or None where a merge is not possible."""
        if kind == "merge":
            merged = MergeStage.build(self.graph.module, node_groups)
            return None if merged is None else self.on_workers([lambda: merged(self.env)], split)
        return self.on_workers([self._group_call(nodes) for nodes in node_groups], split)

    def full_width(self, node_groups: Sequence, split) -> bool:
        """One group on every thread: the executor fuses it with its full-width neighbours."""
        return len(node_groups) == 1 and tuple(split) == (self.threads,)
