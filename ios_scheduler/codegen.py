"""Each group of a schedule as one generated Python function (torch.fx code generation).

Interpreting a group node by node (map each argument through a dict, look the submodule
up by its dotted name, call it) costs microseconds per operator, which a batch-1 network
of a few hundred small operators pays again and again. A group compiled here is a
GraphModule holding just the group's nodes: fx generates straight-line Python for it
(`conv_3 = self.stem.conv(x); relu_2 = torch.relu(conv_3); ...`), so running it costs one
call plus what the operators cost. Its inputs are the values it reads from outside the group,
its outputs the values something outside the group reads; both move through the executor's
value table once per group, not once per operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from torch import fx


@dataclass
class CompiledGroup:
    """A group's nodes as one callable: `run(env)` reads its inputs from env and stores its outputs."""

    module: fx.GraphModule
    inputs: tuple[fx.Node, ...]  # nodes of the original graph whose values the group reads
    outputs: tuple[fx.Node, ...]  # the group's nodes whose values are read outside it

    def __post_init__(self) -> None:
        self._forward = self.module.forward  # the generated function itself: no nn.Module call machinery

    def run(self, env: dict) -> None:
        values = self._forward(*[env[node] for node in self.inputs])
        env.update(zip(self.outputs, values))


def compile_group(gm: fx.GraphModule, nodes: Sequence[fx.Node]) -> CompiledGroup:
    """The nodes (in an order that respects their dependencies) of `gm` as one generated function."""
    members = set(nodes)
    inputs: list[fx.Node] = []
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in members and arg not in inputs:
                inputs.append(arg)
    graph = fx.Graph()
    copies = {node: graph.placeholder(f"in_{i}_{node.name}") for i, node in enumerate(inputs)}
    for node in nodes:
        copies[node] = graph.node_copy(node, copies.__getitem__)
    outputs = tuple(node for node in nodes if any(user not in members for user in node.users))
    graph.output(tuple(copies[node] for node in outputs))
    # The root gm lends its submodules and attributes: the generated code calls the same objects.
    return CompiledGroup(fx.GraphModule(gm, graph, class_name="IOSGroup"), tuple(inputs), outputs)
