"""A model of next to no cost, as a user exports it: two linear layers (64 → 128 → 10 classes) with
torch.export and a dynamic batch, written to OUT (a .pt2 file packrat serves as a model).

    .venv/bin/python benchmarks/mlp_export.py /tmp/mlp.pt2
    .venv/bin/packrat bench peers --model /tmp/mlp.pt2 --batches 1,8 --rounds 10 --peers packrat,onnxruntime

The weights are seeded, so every run writes the same model.
"""

from __future__ import annotations

import sys

import torch


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.hidden, self.out = torch.nn.Linear(64, 128), torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.relu(self.hidden(x)))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    torch.manual_seed(0)
    batch = torch.export.Dim("batch", min=1, max=1024)
    program = torch.export.export(MLP().eval(), (torch.randn(2, 64),), dynamic_shapes={"x": {0: batch}})
    torch.export.save(program, argv[0])
    print(f"wrote {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
