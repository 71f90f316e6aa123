"""SqueezeNet 1.1 at 224x224, 1000 classes.

Each fire module is its own module whose two expand branches read the same
squeezed tensor and are concatenated, so torch.fx (and the IOS scheduler) sees
two independent convolutions per module.
"""
from __future__ import annotations

import torch
from torch import nn


class Fire(nn.Module):
    """1x1 squeeze -> (1x1 expand | 3x3 expand), concatenated. Out: e1 + e3 channels."""

    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.expand1 = nn.Sequential(nn.Conv2d(squeeze, e1, 1), nn.ReLU())
        self.expand3 = nn.Sequential(nn.Conv2d(squeeze, e3, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.expand1(s), self.expand3(s)], 1)


def _pool() -> nn.MaxPool2d:
    # ceil_mode keeps the border row/column: 111 -> 55 -> 27 -> 13.
    return nn.MaxPool2d(3, stride=2, ceil_mode=True)


class SqueezeNet(nn.Module):
    """Version 1.1: 3x3 stem with 64 filters and pooling early, ~2.4x cheaper than 1.0."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(), _pool(),     # -> 55x55x64
            Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), _pool(),   # -> 27x27x128
            Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), _pool(),  # -> 13x13x256
            Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
            Fire(384, 64, 256, 256), Fire(512, 64, 256, 256),       # -> 13x13x512
        )
        # No fully connected layer: a 1x1 conv gives per-class maps, averaged to logits.
        self.dropout = nn.Dropout(0.5)  # identity in eval
        self.classifier = nn.Conv2d(512, num_classes, 1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                nn.init.zeros_(m.bias)
        # Small final weights keep the random logits near zero, as a freshly initialised net has.
        nn.init.normal_(self.classifier.weight, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.classifier(self.dropout(self.features(x))))
        return torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)


def squeezenet() -> SqueezeNet:
    return SqueezeNet()
