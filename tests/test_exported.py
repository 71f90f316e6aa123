"""torch.export programs saved with torch.export.save (packrat.models.exported): small modules
exported and saved into a temporary directory, then served through resolve()."""

from __future__ import annotations

import os
import warnings

import pytest
import torch

from model_checks import close, two_threads  # noqa: F401 (autouse fixture)
from packrat.models.spec import MASK
from packrat.models.zoo import prepare, resolve

# AOTInductor (compile mode) goes through TorchScript internals; their deprecation notices are noise here.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")

BATCH = torch.export.Dim("batch")


class TwoInputs(torch.nn.Module):
    """Token ids and their mask -> a masked mean of the token embeddings (8 dims), plus the
    per-token states as a second output, which packrat leaves aside."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = torch.nn.Embedding(50, 8)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor):
        states = self.embed(input_ids) * attention_mask.unsqueeze(-1)
        return states.sum(1) / attention_mask.sum(1, keepdim=True).clamp(min=1), states


def _save(module, args, dynamic_shapes, path) -> str:
    with torch.no_grad():
        program = torch.export.export(module, args, dynamic_shapes=dynamic_shapes)
    torch.export.save(program, path)
    return str(path)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(tiny CNN, its program's path), exported once with a dynamic batch dim."""
    module = resolve("tiny").build()
    path = _save(module, (torch.randn(2, 3, 32, 32),), ({0: BATCH},), tmp_path_factory.mktemp("pt2") / "tinycnn.pt2")
    return module, path


def _tokens(length: int = 6):
    return torch.zeros(2, length, dtype=torch.long), torch.ones(2, length, dtype=torch.long)


def test_round_trip_inputs_and_outputs(saved):
    module, path = saved
    spec = resolve(path)
    assert spec.name == "tinycnn" and spec.task == "classification" and spec.scriptable
    assert [(s.name, s.shape, s.dtype, s.fill) for s in spec.inputs] == [("x", (3, 32, 32), "float32", None)]
    assert spec.sources == (path,)
    assert resolve(path, (3, 32, 32)).inputs == spec.inputs  # the shape the pool passes back is accepted
    built = spec.build()
    assert not built.training and built.eval() is built  # the program's own module would refuse eval()
    with torch.no_grad():
        for batch in (1, 3):
            x = spec.example_input(batch)
            assert close(built(x), module(x))
        eager, examples, used = prepare(spec, 3, "eager")
        assert used == "eager" and close(eager(*examples), module(*examples))


def test_script_mode_traces_the_program(saved):
    module, path = saved
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)  # the wrapper quiets the guards' warnings
        traced, examples, used = prepare(resolve(path), 2, "script")
    assert used == "script"
    with torch.no_grad():
        assert close(traced(*examples), module(*examples))


@pytest.mark.integration
def test_two_inputs_eager_and_compiled(tmp_path):
    torch.manual_seed(0)  # the same program bytes every run: the compiled package is found in this machine's cache
    module = TwoInputs().eval()
    path = _save(module, _tokens(), {"input_ids": {0: BATCH}, "attention_mask": {0: BATCH}}, tmp_path / "two.pt2")
    spec = resolve(path)
    assert [(s.name, s.shape, s.dtype, s.fill) for s in spec.inputs] == [
        ("input_ids", (6,), "int64", None), (MASK, (6,), "int64", "ones")]
    inputs = spec.example_inputs(2)
    out = spec.build()(*inputs)  # the first of the program's two outputs
    assert out.shape == (2, 8)
    torch.testing.assert_close(out, module(*inputs)[0])
    # Compile mode exports the wrapper again and builds an AOTInductor package for batch 1 (one
    # package: a larger batch adds one per size of its ladder): the file's one compile.
    compiled, examples, used = prepare(spec, 1, "compile")
    assert used == "compile"
    for batch in (1, 3):  # a package's own size, and larger batches in chunks, both inputs sliced alike
        inputs = spec.example_inputs(batch)
        torch.testing.assert_close(compiled(*inputs), module(*inputs)[0])


def test_dynamic_length_set_by_input_shape(tmp_path):
    seq = torch.export.Dim("seq", max=32)
    path = _save(TwoInputs().eval(), _tokens(), {"input_ids": {0: BATCH, 1: seq}, "attention_mask": {0: BATCH, 1: seq}},
                 tmp_path / "dyn.pt2")
    with pytest.raises(ValueError, match="dim 1 of input 'input_ids' is dynamic"):
        resolve(path)
    spec = resolve(path, (12,))  # the mask shares the ids' length symbol
    assert [s.shape for s in spec.inputs] == [(12,), (12,)]
    assert spec.build()(*spec.example_inputs(2)).shape == (2, 8)
    with pytest.raises(ValueError, match=r"\[0, 32\]"):
        resolve(path, (64,))


def test_input_shape_must_match_static_dims(saved):
    _, path = saved
    with pytest.raises(ValueError, match="dim 2 is 32, not 64"):
        resolve(path, (3, 64, 32))
    with pytest.raises(ValueError, match="has 2 dims"):
        resolve(path, (3, 32))


def test_static_batch_is_rejected(tmp_path):
    path = _save(TwoInputs().eval(), _tokens(), None, tmp_path / "static.pt2")
    with pytest.raises(ValueError, match=r"static batch size \(2\).*Dim\(\"batch\"\)"):
        resolve(path)


def test_non_tensor_input_and_output_are_rejected(tmp_path):
    class Scaled(torch.nn.Module):
        def forward(self, x, k: int):
            return x * k

    class Named(torch.nn.Module):
        def forward(self, x):
            return {"out": x}

    path = _save(Scaled(), (torch.ones(2, 3), 3), {"x": {0: BATCH}, "k": None}, tmp_path / "scaled.pt2")
    with pytest.raises(ValueError, match="input 'k' is a constant, not a tensor"):
        resolve(path)
    path = _save(Named(), (torch.ones(2, 3),), ({0: BATCH},), tmp_path / "named.pt2")
    with pytest.raises(ValueError, match="returns a dict"):
        resolve(path)


def test_bad_files(tmp_path, capfd):
    with pytest.raises(ValueError, match="model file not found"):
        resolve(str(tmp_path / "missing.pt2"))
    garbage = tmp_path / "x.pt2"
    garbage.write_bytes(os.urandom(256))
    with pytest.raises(ValueError, match="cannot load torch.export program") as raised:
        resolve(str(garbage))
    assert "\n" not in str(raised.value) and raised.value.__cause__ is None and raised.value.__suppress_context__
    assert "Traceback" not in capfd.readouterr().err  # torch's logged traceback is dropped


def test_programs_load_from_several_threads_at_once(tmp_path):
    """torch.export.load is not thread-safe: the profiler's early builds load the program beside its
    points (issue 63: one of them failed, "_CURRENT_DESERIALIZER is already set")."""
    from concurrent.futures import ThreadPoolExecutor

    from packrat.models.exported import _load

    path = _save(torch.nn.Linear(4, 2), (torch.randn(2, 4),), ({0: BATCH},), tmp_path / "linear.pt2")
    with ThreadPoolExecutor(4) as pool:
        programs = list(pool.map(lambda _: _load(str(path)), range(8)))
    assert len(programs) == 8
