"""Graph capture with torch.fx: operators, edges, shapes, parts."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from packrat.ios_scheduler.graph import GraphCaptureError, capture
from packrat.models.inception import InceptionA, InceptionE


def test_inception_block_graph_has_parallel_branches_and_shapes():
    block = InceptionE(64).eval()
    x = torch.randn(1, 64, 8, 8)
    graph = capture(block, (x,))
    assert len(graph) > 10
    for op in graph.ops:  # topological numbering: inputs always come earlier
        assert all(i < op.index for i in op.inputs)
        for j in op.inputs:
            assert (graph.succ[j] >> op.index) & 1
    last = graph.ops[-1]
    with torch.inference_mode():
        assert last.shape == tuple(block(x).shape)
    sources = [op for op in graph.ops if not op.inputs]
    assert len(sources) >= 3  # several branches start from the block input


def test_parts_respect_the_size_and_prefer_bottlenecks():
    x = torch.randn(1, 32, 8, 8)
    first = InceptionA(32, 8).eval()
    with torch.inference_mode():
        channels = first(x).shape[1]
    model = nn.Sequential(first, InceptionA(channels, 8)).eval()
    graph = capture(model, (x,))
    cuts = graph.bottlenecks()
    parts = graph.parts(max_part_size=len(graph) // 2 + 2)
    assert [i for p in parts for i in p] == list(range(len(graph)))
    assert all(len(p) <= len(graph) // 2 + 2 for p in parts)
    assert all(p.stop in cuts for p in parts[:-1])  # the blocks join at the concat: a single tensor
    for part in parts:
        local = graph.part_succ(part)
        assert all(mask < (1 << len(part)) for mask in local)


class DataDependent(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # control flow on a tensor value: fx cannot trace it
            return x
        return -x


def test_untraceable_model_names_the_problem():
    with pytest.raises(GraphCaptureError, match="torch.fx cannot trace DataDependent: .*"):
        capture(DataDependent(), (torch.ones(2),))
