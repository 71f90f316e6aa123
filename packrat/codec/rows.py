"""The batch's input rows: one preallocated tensor per model input, a row per request, over any
buffer (an instance's shared-memory segment, or memory of its own). The pool's parent writes a raw
tensor body straight into its row; the instance decodes every other body into its row; the model
reads the first rows as they lie (codec.batch)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from packrat.codec.config import CodecConfig

ALIGN = 64  # bytes: each input's rows start on a cache line


@dataclass(frozen=True)
class RowsLayout:
    """Where each model input's rows lie in a buffer: `slots` rows of one sample each, input after
    input, each input's rows starting on a cache line. Plain numbers, so the pool's parent (which
    writes raw bodies into the first input's rows) and its instance (which reads them) agree."""
    slots: int
    regions: tuple[tuple[int, int], ...]  # (offset, bytes of one row) per input, in the model's order

    @classmethod
    def of(cls, config: CodecConfig, slots: int) -> "RowsLayout":
        regions, offset = [], 0
        for spec in config.input_specs():
            row = _numel(spec.shape) * torch.empty((), dtype=getattr(torch, spec.dtype)).element_size()
            regions.append((offset, row))
            offset = _aligned(offset + row * slots)
        return cls(slots, tuple(regions))

    @property
    def size(self) -> int:
        """Bytes of every input's rows: a buffer's other contents (request bodies) start here."""
        offset, row = self.regions[-1]
        return _aligned(offset + row * self.slots)

    @property
    def row_bytes(self) -> int:
        """One sample of the first input, in bytes: a raw tensor body of this size is written
        straight into its row."""
        return self.regions[0][1]

    def row_offset(self, index: int) -> int:
        """Where the first input's row `index` starts."""
        return self.regions[0][0] + index * self.row_bytes


class InputRows:
    """One tensor per model input, (slots, *shape), over a buffer laid out by a RowsLayout: the
    batch the model reads. Over shared memory in a pool instance; allocate() makes its own."""

    def __init__(self, config: CodecConfig, layout: RowsLayout, buffer):
        self.layout = layout
        self.tensors = tuple(
            torch.frombuffer(buffer, dtype=getattr(torch, spec.dtype), count=_numel(spec.shape) * layout.slots,
                             offset=offset).view(layout.slots, *spec.shape)
            for spec, (offset, _) in zip(config.input_specs(), layout.regions))
        self.buffer = buffer  # kept alive while the tensors view it

    def from_row(self, start: int) -> "InputRows":
        """The rows from `start` on, as rows of their own (a batch answered in parts)."""
        if start == 0:
            return self
        part = copy.copy(self)
        part.tensors = tuple(tensor[start:] for tensor in self.tensors)
        return part

    @classmethod
    def allocate(cls, config: CodecConfig, slots: int) -> "InputRows":
        layout = RowsLayout.of(config, slots)
        return cls(config, layout, bytearray(layout.size))

    @property
    def slots(self) -> int:
        return len(self.tensors[0])

    def row(self, index: int) -> tuple[torch.Tensor, ...]:
        return tuple(tensor[index] for tensor in self.tensors)

    def put(self, index: int, samples: tuple[torch.Tensor, ...]) -> bool:
        """Row `index` holds the one sample of each input in `samples` ((1, *shape) each) from now
        on: copied in, unless it was decoded there. False (nothing done) for several samples."""
        if index >= self.slots or any(len(sample) != 1 for sample in samples):
            return False
        for row, sample in zip(self.row(index), samples):
            if sample.data_ptr() != row.data_ptr():
                row.copy_(sample[0])
        return True

    def first(self, count: int) -> tuple[torch.Tensor, ...]:
        """The first `count` rows of every input: the batch, as views."""
        return tuple(tensor[:count] for tensor in self.tensors)

    def taken(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        """The rows at `indices` (a batch with holes where requests failed), gathered (a copy)."""
        if indices == list(range(len(indices))):
            return self.first(len(indices))
        where = torch.tensor(indices)
        return tuple(tensor.index_select(0, where) for tensor in self.tensors)


def _numel(shape) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _aligned(offset: int) -> int:
    return -(-offset // ALIGN) * ALIGN
