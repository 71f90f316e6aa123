"""A model's operator graph, captured with torch.fx, for the IOS search.

Operators are the fx nodes that compute (calls of modules, functions and methods),
numbered in fx's topological order; `succ[i]` is the bitmask of the operators that
consume operator i's output. A cheap node that is the only consumer of its only input
(batch norm, an activation, a reshape after a convolution) joins its producer's
operator: conv → bn → relu is one operator, as in IOS, and the search space stays small. Shapes come from running an example input through the
graph (torch.fx's ShapeProp). Large graphs are cut into parts solved one after another,
preferably where a single tensor is all that crosses the cut (a bottleneck: nothing is
lost by the cut, since no two operators on either side could have run together).

The graph is the model as IOS runs it (`trace`): each batch norm that follows a convolution folded
into its weights, and 4-d weights in channels_last memory format, so oneDNN runs the convolutions
in the layout it is fastest in (the first convolution's output is channels_last, and the layout
carries through). Plain PyTorch on this graph, 2 threads, batch 1 (BENCHMARKS.md, issue 49):
Inception-v3 58.6 -> 43.3 ms, RandWire 24.1 -> 17.4, NASNet-A 48.6 -> 23.4; channels_last does
most of it.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import fx
from torch.fx.experimental.optimization import fuse
from torch.fx.passes.shape_prop import ShapeProp

COMPUTE = ("call_module", "call_function", "call_method")


class GraphCaptureError(ValueError):
    """The model cannot be captured; the message names the construct."""


HEAVY = (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d, torch.nn.Linear)


@dataclass(frozen=True)
class Operator:
    index: int
    nodes: tuple[str, ...]  # fx node names, run in this order; the first one reads the inputs
    target: str  # what its first node calls, e.g. "conv2d" for a Conv2d module, "cat", "add"
    inputs: tuple[int, ...]  # operators whose outputs it reads
    shape: tuple[int, ...] | None  # output shape on the example input (None: not a tensor)

    @property
    def node(self) -> str:
        return self.nodes[0]


@dataclass
class Graph:
    module: fx.GraphModule
    ops: list[Operator]
    succ: list[int]

    def __len__(self) -> int:
        return len(self.ops)

    def bottlenecks(self) -> list[int]:
        """Positions k where only one operator's output crosses from ops[:k] to ops[k:]."""
        cuts = []
        for k in range(1, len(self.ops)):
            crossing = {i for i in range(k) if self.succ[i] >> k}
            if len(crossing) <= 1:
                cuts.append(k)
        return cuts

    def parts(self, max_part_size: int) -> list[range]:
        """Consecutive operator ranges of at most max_part_size, cut at the last bottleneck
        that fits (or, with none, at the size limit: still correct, maybe less parallel)."""
        if max_part_size < 1:
            raise ValueError("max_part_size must be >= 1")
        cuts, parts, start = self.bottlenecks(), [], 0
        while start < len(self.ops):
            end = min(start + max_part_size, len(self.ops))
            if end < len(self.ops):
                inside = [c for c in cuts if start < c <= end]
                end = inside[-1] if inside else end
            parts.append(range(start, end))
            start = end
        return parts

    def part_succ(self, part: range) -> list[int]:
        """succ bitmasks re-indexed within a part (edges leaving the part dropped)."""
        width = (1 << len(part)) - 1
        return [(self.succ[i] >> part.start) & width for i in part]


def _target_name(gm: fx.GraphModule, node: fx.Node) -> str:
    if node.op == "call_module":
        return type(gm.get_submodule(node.target)).__name__.lower()
    return getattr(node.target, "__name__", str(node.target))


def trace(module: torch.nn.Module) -> fx.GraphModule:
    """`module` (in eval mode) as IOS runs it: traced by torch.fx, each batch norm after a
    convolution folded into it, 4-d weights channels_last (the module docstring says why). Search
    and execution both run this graph, so a schedule's node names are its nodes'."""
    gm = fuse(copy.deepcopy(module).eval(), inplace=True)  # the caller's module is left as it was
    return gm.to(memory_format=torch.channels_last)


def capture(module: torch.nn.Module, example_inputs: tuple) -> Graph:
    """The operator DAG of `module` as IOS runs it (`trace`), with shapes from `example_inputs`."""
    try:
        gm = trace(module)
    except Exception as exc:  # torch.fx raises TraceError, TypeError, ... for untraceable code
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise GraphCaptureError(f"torch.fx cannot trace {type(module).__name__}: {first}") from None
    try:
        with torch.inference_mode():
            ShapeProp(gm).propagate(*example_inputs)
    except Exception as exc:
        raise GraphCaptureError(f"running the example input through {type(module).__name__} failed: {exc}") from None
    nodes = [n for n in gm.graph.nodes if n.op in COMPUTE]
    owner: dict[fx.Node, int] = {}  # node -> operator index
    members: list[list[fx.Node]] = []
    for node in nodes:
        producers = [a for a in node.all_input_nodes if a in owner]
        if _is_tail(gm, node, producers):
            owner[node] = owner[producers[0]]
            members[owner[node]].append(node)
        else:
            owner[node] = len(members)
            members.append([node])
    ops, succ = [], [0] * len(members)
    for i, group in enumerate(members):
        inputs = tuple(sorted({owner[a] for n in group for a in n.all_input_nodes if a in owner} - {i}))
        for j in inputs:
            succ[j] |= 1 << i
        meta = group[-1].meta.get("tensor_meta")
        shape = tuple(meta.shape) if meta is not None and hasattr(meta, "shape") else None
        ops.append(Operator(i, tuple(n.name for n in group), _target_name(gm, group[0]), inputs, shape))
    return Graph(gm, ops, succ)


def _is_tail(gm: fx.GraphModule, node: fx.Node, producers: list[fx.Node]) -> bool:
    """A cheap single-input node whose producer feeds nothing else: it runs right after it."""
    if len(node.all_input_nodes) != 1 or len(producers) != 1 or len(producers[0].users) != 1:
        return False
    return not (node.op == "call_module" and isinstance(gm.get_submodule(node.target), HEAVY))
