"""Inception-v3 at 299x299 (eval graph: no auxiliary head).

Each mixed block is its own module whose forward only runs branches and
concatenates them, so torch.fx can trace a block and a scheduler (IOS) can see
the independent branches.
"""
from __future__ import annotations

import torch
from torch import nn


class ConvBN(nn.Module):
    """Conv (no bias) + BatchNorm(eps=1e-3) + ReLU: the unit every Inception branch is built from."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1,
                 padding: int | tuple[int, int] = 0) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, kernel, stride=stride, padding=padding, bias=False)
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.bn(self.conv(x)))


def chain(*layers: nn.Module) -> nn.Sequential:
    return nn.Sequential(*layers)


def conv1x7(cin: int, cout: int) -> ConvBN:
    return ConvBN(cin, cout, (1, 7), padding=(0, 3))


def conv7x1(cin: int, cout: int) -> ConvBN:
    return ConvBN(cin, cout, (7, 1), padding=(3, 0))


def pool_proj(cin: int, cout: int) -> nn.Sequential:
    """3x3 average pool (same size) then 1x1 projection."""
    return chain(nn.AvgPool2d(3, stride=1, padding=1), ConvBN(cin, cout, 1))


class Stem(nn.Module):
    """299x299x3 -> 35x35x192 with plain convolutions and two max pools."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = chain(
            ConvBN(3, 32, 3, stride=2), ConvBN(32, 32, 3), ConvBN(32, 64, 3, padding=1),
            nn.MaxPool2d(3, stride=2),
            ConvBN(64, 80, 1), ConvBN(80, 192, 3),
            nn.MaxPool2d(3, stride=2),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class InceptionA(nn.Module):
    """35x35 block: 1x1 | 1x1->5x5 | 1x1->3x3->3x3 | pool->1x1. Out: 224 + pool_ch."""

    def __init__(self, cin: int, pool_ch: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 64, 1)
        self.b5 = chain(ConvBN(cin, 48, 1), ConvBN(48, 64, 5, padding=2))
        self.b3 = chain(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, padding=1))
        self.bp = pool_proj(cin, pool_ch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.bp(x)], 1)


class InceptionB(nn.Module):
    """Grid reduction 35 -> 17: strided 3x3 | 1x1->3x3->strided 3x3 | max pool. Out: 480 + cin."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = ConvBN(cin, 384, 3, stride=2)
        self.b33 = chain(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, stride=2))
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b33(x), self.pool(x)], 1)


class InceptionC(nn.Module):
    """17x17 block with factorized 7x7 convs (1x7 and 7x1), `mid` channels inside. Out: 768."""

    def __init__(self, cin: int, mid: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 192, 1)
        self.b7 = chain(ConvBN(cin, mid, 1), conv1x7(mid, mid), conv7x1(mid, 192))
        self.b77 = chain(ConvBN(cin, mid, 1), conv7x1(mid, mid), conv1x7(mid, mid),
                         conv7x1(mid, mid), conv1x7(mid, 192))
        self.bp = pool_proj(cin, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b77(x), self.bp(x)], 1)


class InceptionD(nn.Module):
    """Grid reduction 17 -> 8: 1x1->strided 3x3 | 1x1->1x7->7x1->strided 3x3 | max pool. Out: 512 + cin."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = chain(ConvBN(cin, 192, 1), ConvBN(192, 320, 3, stride=2))
        self.b7 = chain(ConvBN(cin, 192, 1), conv1x7(192, 192), conv7x1(192, 192),
                        ConvBN(192, 192, 3, stride=2))
        self.pool = nn.MaxPool2d(3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7(x), self.pool(x)], 1)


class InceptionE(nn.Module):
    """8x8 block whose 3x3 paths fan out into parallel 1x3 and 3x1 convs. Out: 2048."""

    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 320, 1)
        self.b3_in = ConvBN(cin, 384, 1)
        self.b3_a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.b3_b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.b33_in = chain(ConvBN(cin, 448, 1), ConvBN(448, 384, 3, padding=1))
        self.b33_a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.b33_b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.bp = pool_proj(cin, 192)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y3 = self.b3_in(x)
        y33 = self.b33_in(x)
        return torch.cat([
            self.b1(x),
            self.b3_a(y3), self.b3_b(y3),
            self.b33_a(y33), self.b33_b(y33),
            self.bp(x),
        ], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.blocks = chain(
            Stem(),
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64),  # 35x35
            InceptionB(288),                                               # -> 17x17x768
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768),                                               # -> 8x8x1280
            InceptionE(1280), InceptionE(2048),
        )
        self.dropout = nn.Dropout(0.5)  # identity in eval; kept for parity with training
        self.fc = nn.Linear(2048, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.blocks(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(self.dropout(x))


def inception_v3() -> InceptionV3:
    return InceptionV3()
