"""The examples of the README and the manual as written: the JSON bodies their curl lines send
decode for the model they name (docs/requests.md holds the request table), and the torch.export
snippet (docs/models.md) saves a program that packrat serves."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from packrat.codec.codec import Codec

from packrat.codec.config import CodecConfig
from packrat.models.zoo import prepare, resolve

ROOT = Path(__file__).resolve().parent.parent
# The README and every page of the manual a user copies commands from (the benchmark pages are measurements).
TEXT = "\n".join(p.read_text() for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
MODELS_PAGE = (ROOT / "docs" / "models.md").read_text()


def inline_bodies() -> list[tuple[str, tuple[int, ...] | None, str]]:
    """(model, --input-shape, body) of every curl line that sends a tensor JSON body inline
    (-d '...'; text bodies need the archive's tokenizer and are checked end to end elsewhere)."""
    found = []
    for line in TEXT.splitlines():
        for body in re.findall(r"-d '(\{.*?\})'", line):
            if '"text"' in body:
                continue
            model = re.search(r"/predictions/(\w+)", line)
            length = re.search(r"--input-shape (\d+)", line)
            found.append((model.group(1) if model else "resnet50", (int(length.group(1)),) if length else None, body))
    return found


@pytest.mark.parametrize(("model", "shape", "body"), inline_bodies())
def test_inline_json_bodies_decode(model, shape, body):
    spec = resolve(model, shape)
    decoded = Codec(CodecConfig.for_model(spec)).decode(json.loads(body), "application/json")
    assert [tuple(x.shape[1:]) for x in decoded.samples] == [spec_input.shape for spec_input in spec.inputs]


def test_there_are_inline_bodies_to_check():
    assert sum("input_ids" in body for _, _, body in inline_bodies()) >= 2


def test_the_export_snippet_saves_a_program_packrat_serves(tmp_path, monkeypatch):
    snippet = re.search(r"## `torch.export` programs.*?```python\n(.*?)```", MODELS_PAGE, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten())
    exec(snippet, {"torch": torch, "model": model})  # noqa: S102 (the manual's own text)
    spec = resolve(str(tmp_path / "model.pt2"))
    assert spec.input_shape == (3, 224, 224)
    module, examples, used = prepare(spec, 3, "eager")
    with torch.no_grad():
        assert torch.allclose(module(*examples), model(*examples), atol=1e-6)
