"""A deliberately small CNN: fast enough (~1 ms) that tests can serve it everywhere."""
from __future__ import annotations

import torch
from torch import nn


def _conv_bn_relu(cin: int, cout: int, stride: int) -> nn.Sequential:
    # BatchNorm is kept so graph mode has a conv+BN fold to do, as in the real models.
    return nn.Sequential(
        nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU(inplace=True),
    )


class TinyNet(nn.Module):
    """3x32x32 image -> 10 logits."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.features = nn.Sequential(
            _conv_bn_relu(3, 32, 1),
            _conv_bn_relu(32, 64, 2),
            _conv_bn_relu(64, 128, 2),
        )
        self.fc = nn.Linear(128, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.features(x)
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def tiny() -> TinyNet:
    return TinyNet()



TINY_TEXT_VOCAB = 1000
TINY_TEXT_LENGTH = 16


class TinyTextNet(nn.Module):
    """16 token ids and their attention mask -> a 32-dim embedding (mean of the real tokens'
    embeddings through a tanh layer): the text counterpart of TinyNet, for tests of the text path."""

    def __init__(self, vocab: int = TINY_TEXT_VOCAB, dim: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, tokens: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask.unsqueeze(-1).to(torch.float32)
        mean = (self.embed(tokens) * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
        return torch.tanh(self.proj(mean))


def tiny_text() -> TinyTextNet:
    return TinyTextNet()
