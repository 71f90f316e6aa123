"""Groups compiled to generated functions compute what the graph computes, on every zoo network."""

from __future__ import annotations

import pytest
import torch
from torch import fx, nn

from packrat.ios_scheduler.api import sequential_schedule
from packrat.ios_scheduler.codegen import compile_group
from packrat.ios_scheduler.graph import capture
from packrat.ios_scheduler.runtime import ScheduledModule, _fuse_full_width
from packrat.models.zoo import ZOO, resolve
from model_checks import marked


class Diamond(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        left = torch.relu(self.a(x))
        right = self.b(x)
        return left + right, right


def test_a_group_reads_its_outside_inputs_and_gives_what_outside_reads():
    gm = fx.symbolic_trace(Diamond())
    nodes = {n.name: n for n in gm.graph.nodes}
    group = compile_group(gm, [nodes["b"], nodes["a"], nodes["relu"]])
    assert [n.name for n in group.inputs] == ["x"]
    assert [n.name for n in group.outputs] == ["b", "relu"]  # 'a' is read only inside the group
    x = torch.randn(2, 4)
    env = {nodes["x"]: x}
    group.run(env)
    assert torch.equal(env[nodes["relu"]], torch.relu(gm.a(x))) and torch.equal(env[nodes["b"]], gm.b(x))
    assert group.module.a is gm.a  # the same parameters, not a copy


def test_consecutive_full_width_stages_fuse_and_others_do_not():
    steps = [("parallel", [[1]], (2,)), ("parallel", [[2]], (2,)), ("parallel", [[3], [4]], (1, 1)),
             ("parallel", [[5]], (2,)), ("merge", [[6], [7]], (2,)), ("parallel", [[8]], (2,))]
    assert _fuse_full_width(steps, 2) == [("parallel", [[1, 2]], (2,), [0, 1]), ("parallel", [[3], [4]], (1, 1), [2]),
                                          ("parallel", [[5]], (2,), [3]), ("merge", [[6], [7]], (2,), [4]),
                                          ("parallel", [[8]], (2,), [5])]


@pytest.mark.parametrize("fuse", [True, False], ids=["fused", "a-function-per-operator"])
@pytest.mark.parametrize("name", marked(list(ZOO), pytest.mark.slow, {"bert_base", "gpt2", "randwire", "nasnet"}))
def test_generated_groups_equal_the_original_on_every_zoo_network(name, fuse):
    spec = resolve(name)
    module, x = spec.build().eval(), spec.example_inputs(1)
    graph = capture(module, x)
    compiled = ScheduledModule(graph.module, sequential_schedule(graph, torch.get_num_threads(), 1, name),
                                fuse=fuse)
    compiled.plain = False  # through the executor, not the plain-graph shortcut
    with torch.inference_mode():
        want, got = module(*x), compiled(*x)
    compiled.close()
    for a, b in zip(want if isinstance(want, tuple) else (want,), got if isinstance(got, tuple) else (got,)):
        # folding batch norms into convolutions reorders float sums: the error scales with the outputs
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * float(a.abs().max()))
