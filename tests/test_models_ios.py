"""The IOS paper's networks in the zoo: SqueezeNet, RandWire-WS, NASNet-A.

They exist for inter-operator scheduling, so besides shapes and determinism they must
trace with torch.fx into graphs that really have parallel branches.
"""
from __future__ import annotations

from collections import deque

import pytest
import torch
from torch import fx

from packrat.models.zoo import ZOO, prepare
from packrat.models.randwire import DEGREE, NODES, REWIRE_P, dag_predecessors, watts_strogatz
from model_checks import close, two_threads  # noqa: F401 (autouse fixture)

pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")

IOS_MODELS = ["squeezenet", "randwire", "nasnet"]
COMPUTE = ("call_module", "call_function", "call_method")




def compute_nodes(gm: fx.GraphModule) -> list[fx.Node]:
    return [n for n in gm.graph.nodes if n.op in COMPUTE]


def branch_points(gm: fx.GraphModule) -> int:
    """Compute nodes whose output two or more compute nodes read: where branches fork."""
    return sum(sum(u.op in COMPUTE for u in n.users) >= 2 for n in compute_nodes(gm))


def cats(gm: fx.GraphModule) -> int:
    return sum(n.target is torch.cat for n in gm.graph.nodes)


# --- zoo entries ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", IOS_MODELS)
def test_spec(name):
    spec = ZOO[name]
    assert spec.name == name and spec.task == "classification"
    assert spec.input_shape == (3, 224, 224) and spec.input_dtype == torch.float32


@pytest.mark.parametrize("name", IOS_MODELS)
@pytest.mark.slow
def test_shapes_determinism_and_fx_trace(name):
    spec = ZOO[name]
    model = spec.build()
    assert not model.training
    x1, x2 = spec.example_input(1), spec.example_input(2)
    with torch.no_grad():
        one, two = model(x1), model(x2)
        assert one.shape == (1, 1000) and two.shape == (2, 1000)
        assert torch.isfinite(two).all() and two.abs().max() > 0
        assert close(two[:1], one)
        assert torch.equal(spec.build()(x1), one)
        gm = fx.symbolic_trace(model)
        assert close(gm(x2), two)


@pytest.mark.parametrize("name", IOS_MODELS)
@pytest.mark.slow
def test_graph_mode_matches_eager(name):
    spec = ZOO[name]
    assert spec.scriptable
    graph, x, mode = prepare(spec, batch=1, graph_mode="script")
    assert mode == "script"
    eager, _, _ = prepare(spec, batch=1, graph_mode=False)
    with torch.no_grad():
        expected = eager(*x)
        assert close(graph(*x), expected)
        assert graph(spec.example_input(2)).shape == (2, 1000)


# --- parallel structure seen by fx ---------------------------------------------------------


def test_squeezenet_fire_modules_fork_into_two_expand_branches():
    gm = fx.symbolic_trace(ZOO["squeezenet"].build())
    assert cats(gm) == 8
    forks = [n for n in compute_nodes(gm) if len(n.users) == 2]
    assert len(forks) == 8  # each squeeze output feeds its 1x1 and 3x3 expand convs
    for n in forks:
        assert {type(gm.get_submodule(u.target)).__name__ for u in n.users} == {"Conv2d"}
    assert len(compute_nodes(gm)) > 60


def test_nasnet_cells_are_wide():
    gm = fx.symbolic_trace(ZOO["nasnet"].build())
    # 16 cells, plus the factorized reductions of the 4 cells after a reduction.
    assert cats(gm) == 16 + 4
    assert branch_points(gm) >= 16 * 2  # both hidden states of every cell fan out
    assert len(compute_nodes(gm)) > 800  # 5-6 two-unit separable convs per cell


def test_randwire_follows_its_random_graphs():
    model = ZOO["randwire"].build()
    gm = fx.symbolic_trace(model)
    forks = sum(sum(1 for p in stage.preds for a in p if a == v) >= 2
                for stage in model.stages for v in range(NODES))
    assert forks > 10 and branch_points(gm) >= forks
    assert len(compute_nodes(gm)) > 3 * NODES * 4  # at least relu, 2 convs, BN per node
    graphs = [stage.preds for stage in model.stages]
    assert graphs[0] != graphs[1] != graphs[2]  # each stage has its own seed


# --- the Watts-Strogatz generator ----------------------------------------------------------


def test_ws_is_deterministic_for_a_seed():
    first = watts_strogatz(NODES, DEGREE, REWIRE_P, seed=7)
    assert first == watts_strogatz(NODES, DEGREE, REWIRE_P, seed=7)
    assert first != watts_strogatz(NODES, DEGREE, REWIRE_P, seed=8)


def test_ws_without_rewiring_is_the_ring_lattice():
    edges = watts_strogatz(8, 4, 0.0, seed=0)
    expected = sorted({tuple(sorted((v, (v + i) % 8))) for v in range(8) for i in (1, 2)})
    assert edges == expected


@pytest.mark.parametrize("seed", range(20))
def test_ws_gives_a_dag_reachable_from_its_inputs(seed):
    edges = watts_strogatz(NODES, DEGREE, REWIRE_P, seed)
    assert len(edges) == len(set(edges)) == NODES * DEGREE // 2  # rewiring moves, never adds
    assert all(0 <= a < b < NODES for a, b in edges)  # no self loops; index order is a DAG
    preds = dag_predecessors(NODES, edges)
    succ: list[list[int]] = [[] for _ in range(NODES)]
    for v, p in enumerate(preds):
        assert all(a < v for a in p)  # topological by index
        for a in p:
            succ[a].append(v)
    inputs = [v for v in range(NODES) if not preds[v]]
    assert inputs and inputs[0] == 0
    seen, todo = set(inputs), deque(inputs)
    while todo:
        for w in succ[todo.popleft()]:
            if w not in seen:
                seen.add(w)
                todo.append(w)
    assert seen == set(range(NODES))


def test_ws_rejects_bad_degree():
    with pytest.raises(ValueError):
        watts_strogatz(8, 3, 0.5, seed=0)
