"""NASNet-A Mobile (4 @ 1056) at 224x224, 1000 classes (eval graph: no auxiliary head).

A cell reads the two previous cells' outputs, h_{i-1} ("prev") and h_i ("cur"), and
forms five blocks, each the sum of two operations on earlier hidden states; the
blocks no other block reads are concatenated. Every cell is its own module, so
torch.fx sees the ten parallel operations of each cell.
"""
from __future__ import annotations

import torch
from torch import nn

# The NASNet-A separable conv is ReLU-sepconv-BN applied twice; RandWire's node op is one such unit.
from packrat.models.randwire import relu_sep_bn


def sep(ch: int, kernel: int, stride: int = 1) -> nn.Sequential:
    """NASNet-A separable op: two ReLU-sepconv-BN units, the first carrying the stride."""
    return nn.Sequential(relu_sep_bn(ch, ch, kernel, stride), relu_sep_bn(ch, ch, kernel))


def avg3(stride: int = 1) -> nn.AvgPool2d:
    # Border windows average only real pixels, as in the NASNet reference.
    return nn.AvgPool2d(3, stride=stride, padding=1, count_include_pad=False)


def max3(stride: int = 1) -> nn.MaxPool2d:
    return nn.MaxPool2d(3, stride=stride, padding=1)


def relu_conv1x1_bn(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.ReLU(), nn.Conv2d(cin, cout, 1, bias=False), nn.BatchNorm2d(cout))


class FactorizedReduce(nn.Module):
    """Halve H and W of h_{i-1} (when the last cell reduced) with two strided 1x1 convs,
    the second on the input shifted by one pixel, so neither path drops every other pixel."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.path1 = nn.Conv2d(cin, cout // 2, 1, stride=2, bias=False)
        self.path2 = nn.Conv2d(cin, cout - cout // 2, 1, stride=2, bias=False)
        self.bn = nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(x)
        shifted = nn.functional.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.path1(x), self.path2(shifted)], 1))


class Inputs(nn.Module):
    """Bring both hidden states to `ch` channels at the current resolution."""

    def __init__(self, prev_ch: int, cur_ch: int, ch: int, prev_is_larger: bool) -> None:
        super().__init__()
        self.prev = FactorizedReduce(prev_ch, ch) if prev_is_larger else relu_conv1x1_bn(prev_ch, ch)
        self.cur = relu_conv1x1_bn(cur_ch, ch)

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prev(prev), self.cur(cur)


class NormalCell(nn.Module):
    """Keeps the resolution. Out: 6 * ch (h_{i-1} and the five blocks)."""

    outputs = 6

    def __init__(self, prev_ch: int, cur_ch: int, ch: int, prev_is_larger: bool) -> None:
        super().__init__()
        self.inputs = Inputs(prev_ch, cur_ch, ch, prev_is_larger)
        self.b0_cur = sep(ch, 3)          # + identity(cur)
        self.b1_prev, self.b1_cur = sep(ch, 3), sep(ch, 5)
        self.b2_cur = avg3()              # + identity(prev)
        self.b3_a, self.b3_b = avg3(), avg3()
        self.b4_a, self.b4_b = sep(ch, 5), sep(ch, 3)

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        p, c = self.inputs(prev, cur)
        return torch.cat([
            p,
            self.b0_cur(c) + c,
            self.b1_prev(p) + self.b1_cur(c),
            self.b2_cur(c) + p,
            self.b3_a(p) + self.b3_b(p),
            self.b4_a(p) + self.b4_b(p),
        ], 1)


class ReductionCell(nn.Module):
    """Halves the resolution. Out: 4 * ch (blocks 1-4; block 0 only feeds blocks 3 and 4)."""

    outputs = 4

    def __init__(self, prev_ch: int, cur_ch: int, ch: int, prev_is_larger: bool) -> None:
        super().__init__()
        self.inputs = Inputs(prev_ch, cur_ch, ch, prev_is_larger)
        self.b0_prev, self.b0_cur = sep(ch, 7, 2), sep(ch, 5, 2)
        self.b1_cur, self.b1_prev = max3(2), sep(ch, 7, 2)
        self.b2_cur, self.b2_prev = avg3(2), sep(ch, 5, 2)
        self.b3_b0 = avg3()               # + identity(block 1)
        self.b4_b0, self.b4_cur = sep(ch, 3), max3(2)

    def forward(self, prev: torch.Tensor, cur: torch.Tensor) -> torch.Tensor:
        p, c = self.inputs(prev, cur)
        b0 = self.b0_prev(p) + self.b0_cur(c)
        b1 = self.b1_cur(c) + self.b1_prev(p)
        b2 = self.b2_cur(c) + self.b2_prev(p)
        b3 = self.b3_b0(b0) + b1
        b4 = self.b4_b0(b0) + self.b4_cur(c)
        return torch.cat([b1, b2, b3, b4], 1)


def _plan(cells_per_stack: int, ch: int) -> list[tuple[type[nn.Module], int]]:
    """(cell type, channels per block): two stem reductions at ch/4 and ch/2, then three
    stacks of normal cells at ch, 2ch, 4ch separated by reduction cells."""
    plan: list[tuple[type[nn.Module], int]] = [(ReductionCell, ch // 4), (ReductionCell, ch // 2)]
    for stack in range(3):
        if stack:
            plan.append((ReductionCell, ch << stack))
        plan += [(NormalCell, ch << stack)] * cells_per_stack
    return plan


class NASNetA(nn.Module):
    """NASNet-A "N @ F": N normal cells per stack, F channels before the classifier (F = 24 * ch)."""

    def __init__(self, cells_per_stack: int = 4, penultimate: int = 1056, stem: int = 32,
                 num_classes: int = 1000) -> None:
        super().__init__()
        if penultimate % 24:
            raise ValueError(f"penultimate filters must be a multiple of 24, got {penultimate}")
        # 224 -> 111 (no padding), then the stem cells bring it to 56 and 28.
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 3, stride=2, bias=False), nn.BatchNorm2d(stem))
        cells, prev_ch, cur_ch, reduced = [], stem, stem, False
        for cell_type, ch in _plan(cells_per_stack, penultimate // 24):
            cells.append(cell_type(prev_ch, cur_ch, ch, prev_is_larger=reduced))
            prev_ch, cur_ch = cur_ch, cell_type.outputs * ch
            reduced = cell_type is ReductionCell
        self.cells = nn.ModuleList(cells)
        self.dropout = nn.Dropout(0.5)  # identity in eval
        self.fc = nn.Linear(cur_ch, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        # Cell outputs are sums of two branches, so with the ReLU gain the random activations
        # would grow ~1.8x per cell (logits ~1e4); unit gain on the cell inputs damps that.
        for m in self.modules():
            if isinstance(m, Inputs):
                for conv in m.modules():
                    if isinstance(conv, nn.Conv2d):
                        nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="linear")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        prev = cur = self.stem(x)  # the first stem cell reads the stem conv twice
        for cell in self.cells:
            prev, cur = cur, cell(prev, cur)
        x = torch.relu(cur)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


def nasnet() -> NASNetA:
    return NASNetA()
