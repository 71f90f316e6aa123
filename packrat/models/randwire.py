"""RandWire-WS, small regime (Xie et al., 2019): 224x224 input, 1000 classes.

Three stages are each a random Watts-Strogatz graph (N=32, K=4, P=0.75) made into
a DAG by node index. The graphs come from a seeded generator written here, so the
same seed always wires the same network. Every graph node is its own module and a
stage's forward only follows the wiring, so torch.fx sees the random topology.
"""
from __future__ import annotations

import random

import torch
from torch import nn

NODES, DEGREE, REWIRE_P = 32, 4, 0.75


def watts_strogatz(n: int, k: int, p: float, seed: int) -> list[tuple[int, int]]:
    """Undirected WS small-world graph as sorted edges (a, b) with a < b.

    Start from a ring where each node links to its k/2 nearest neighbours on each side;
    then, for i = 1..k/2 and every node v in ring order, move the edge to v's i-th
    clockwise neighbour, with probability p, to a uniform node that is neither v nor
    already linked to v. The edge count stays n*k/2.
    """
    if k % 2 or not 0 < k < n - 1:
        raise ValueError(f"need an even k with 0 < k < n-1, got n={n}, k={k}")
    rng = random.Random(seed)
    adj: list[set[int]] = [set() for _ in range(n)]
    for v in range(n):
        for i in range(1, k // 2 + 1):
            u = (v + i) % n
            adj[v].add(u)
            adj[u].add(v)
    for i in range(1, k // 2 + 1):
        for v in range(n):
            if rng.random() >= p:
                continue
            free = [w for w in range(n) if w != v and w not in adj[v]]
            if not free:  # v already links to everyone: nothing to move to
                continue
            u, w = (v + i) % n, rng.choice(free)
            adj[v].discard(u)
            adj[u].discard(v)
            adj[v].add(w)
            adj[w].add(v)
    return sorted((a, b) for a in range(n) for b in adj[a] if a < b)


def dag_predecessors(n: int, edges: list[tuple[int, int]]) -> list[tuple[int, ...]]:
    """Orient every edge from the lower to the higher index; predecessors of each node."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for a, b in edges:
        preds[b].append(a)
    return [tuple(sorted(p)) for p in preds]


def relu_sep_bn(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """ReLU -> depthwise kxk (carries the stride) -> pointwise 1x1 -> BN."""
    return nn.Sequential(
        nn.ReLU(),  # not in place: the input is often another node's shared output
        nn.Conv2d(cin, cin, kernel, stride=stride, padding=kernel // 2, groups=cin, bias=False),
        nn.Conv2d(cin, cout, 1, bias=False),
        nn.BatchNorm2d(cout),
    )


class GraphNode(nn.Module):
    """Sigmoid-weighted sum of the inputs, then ReLU-sepconv3x3-BN."""

    def __init__(self, num_inputs: int, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        # A single input needs no weighting (BN after the conv would undo a scale anyway).
        self.weight = nn.Parameter(torch.zeros(num_inputs)) if num_inputs > 1 else None
        self.op = relu_sep_bn(cin, cout, 3, stride)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        x = inputs[0]
        if self.weight is not None:  # fixed at build time, not data dependent
            w = torch.sigmoid(self.weight)
            x = x * w[0]
            for i in range(1, len(inputs)):
                x = x + inputs[i] * w[i]
        return self.op(x)


class RandomStage(nn.Module):
    """One random graph: input nodes read the stage input with stride 2, sinks are averaged."""

    def __init__(self, cin: int, cout: int, seed: int) -> None:
        super().__init__()
        self.preds = dag_predecessors(NODES, watts_strogatz(NODES, DEGREE, REWIRE_P, seed))
        has_succ = {a for p in self.preds for a in p}
        self.sinks = [v for v in range(NODES) if v not in has_succ]
        self.nodes = nn.ModuleList(
            GraphNode(len(p), cout, cout, 1) if p else GraphNode(1, cin, cout, 2) for p in self.preds
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for node, preds in zip(self.nodes, self.preds):
            outs.append(node(*[outs[j] for j in preds]) if preds else node(x))
        y = outs[self.sinks[0]]
        for v in self.sinks[1:]:
            y = y + outs[v]
        return y * (1.0 / len(self.sinks))


class RandWire(nn.Module):
    """Small regime: two strided 3x3 convs (C/2, C) to 56x56, stages of C, 2C, 4C, 1280-d head."""

    def __init__(self, channels: int = 78, num_classes: int = 1000, seed: int = 0) -> None:
        super().__init__()
        c = channels
        self.stem = nn.Sequential(
            nn.Conv2d(3, c // 2, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c // 2),  # 112
            nn.ReLU(), nn.Conv2d(c // 2, c, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(c),  # 56
        )
        # A different graph per stage; seed fixes all three.
        self.stages = nn.Sequential(
            RandomStage(c, c, seed), RandomStage(c, 2 * c, seed + 1), RandomStage(2 * c, 4 * c, seed + 2),
        )  # -> 28, 14, 7
        self.head = nn.Sequential(
            nn.ReLU(), nn.Conv2d(4 * c, 1280, 1, bias=False), nn.BatchNorm2d(1280), nn.ReLU(),
        )
        self.fc = nn.Linear(1280, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.head(self.stages(self.stem(x)))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def randwire() -> RandWire:
    return RandWire()
