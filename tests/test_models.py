"""Model zoo: shapes, determinism, graph mode, and resolve() of user models."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from packrat.models.zoo import compiled_package, DEFAULT_MODEL, ZOO, prepare, resolve
from packrat.models.spec import ModelSpec
from packrat.models.tiny import TinyNet
from packrat.settings import COMPILE_CACHE_ENV
from model_checks import close, marked, two_threads  # noqa: F401 (autouse fixture)

# Tests script/save tiny models themselves; TorchScript's deprecation notices are noise here.
pytestmark = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.:DeprecationWarning")

OUTPUT_DIM = {"tiny": 10, "tiny_text": 32, "trivial": 10, "resnet50": 1000, "inception_v3": 1000, "bert_base": 768, "gpt2": 50257,
              "squeezenet": 1000, "randwire": 1000, "nasnet": 1000}




# --- factories used through "package.module:factory" --------------------------------------


class TinyWithExample(TinyNet):
    def example_input(self, batch: int) -> torch.Tensor:
        return torch.ones(batch, 3, 32, 32)


def tiny_with_example() -> TinyWithExample:
    return TinyWithExample()


class DictOutput(torch.nn.Module):
    """Runs eagerly but cannot be traced (strict tracing rejects dict outputs)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": self.fc(x)}


def dict_output() -> DictOutput:
    return DictOutput()


NOT_A_FACTORY = 42
THIS = __name__  # importable name of this module, whatever pytest's import mode


# --- the zoo -------------------------------------------------------------------------------


def test_zoo_contents():
    assert set(ZOO) == set(OUTPUT_DIM)
    assert DEFAULT_MODEL in ZOO
    for name, spec in ZOO.items():
        assert isinstance(spec, ModelSpec) and spec.name == name
        assert spec.task in {"classification", "embedding", "language-model"}
    assert ZOO["bert_base"].input_dtype == ZOO["gpt2"].input_dtype == torch.int64
    with pytest.raises(dataclasses.FrozenInstanceError):
        ZOO["tiny"].name = "other"  # type: ignore[misc]


@pytest.mark.parametrize("name", list(OUTPUT_DIM))
def test_example_input(name):
    spec = ZOO[name]
    inputs = spec.example_inputs(3)
    assert len(inputs) == len(spec.inputs)
    for x, input_spec in zip(inputs, spec.inputs):
        assert x.shape == (3, *input_spec.shape) and x.dtype == getattr(torch, input_spec.dtype)
        if input_spec.vocab_size:
            assert 0 <= x.min() and x.max() < input_spec.vocab_size
    assert all(torch.equal(a, b) for a, b in zip(inputs, spec.example_inputs(3)))
    # Sample 0 is the same whatever the batch size, so outputs can be compared across batches.
    assert all(torch.equal(a[:1], b) for a, b in zip(inputs, spec.example_inputs(1)))
    if len(spec.inputs) == 1:
        assert torch.equal(spec.example_input(3), inputs[0])
    else:
        with pytest.raises(ValueError, match="use example_inputs"):
            spec.example_input(3)


@pytest.mark.parametrize("name", marked(list(OUTPUT_DIM), pytest.mark.slow, set(OUTPUT_DIM) - {"tiny", "tiny_text", "squeezenet"}))
def test_build_shapes_and_determinism(name):
    spec = ZOO[name]
    model = spec.build()
    assert not model.training
    with torch.no_grad():
        one = model(*spec.example_inputs(1))
        two = model(*spec.example_inputs(2))
        assert one.shape == (1, OUTPUT_DIM[name]) and two.shape == (2, OUTPUT_DIM[name])
        assert torch.isfinite(two).all()
        assert close(two[:1], one)
        del model
        again = spec.build()(*spec.example_inputs(1))
    assert torch.equal(again, one)


def test_tiny_is_tiny():
    params = sum(p.numel() for p in ZOO["tiny"].build().parameters())
    assert params < 200_000


# --- graph mode ----------------------------------------------------------------------------


# Compiling takes 10-60 s a model on 2 cores: the big networks are checked in script mode here and
# compiled in the benchmarks (graph_modes.py, peers.py check outputs against eager).
@pytest.mark.parametrize(("name", "mode"), marked(marked(
    [("tiny", "compile"), ("tiny_text", "compile"), ("tiny", "script"), ("resnet50", "script"), ("bert_base", "script"),
     ("gpt2", "script")], pytest.mark.integration, {("tiny", "compile"), ("tiny_text", "compile")}),
    pytest.mark.slow, {("resnet50", "script"), ("bert_base", "script"), ("gpt2", "script")}))
def test_graph_mode_matches_eager(name, mode):
    spec = resolve(name, (16,)) if spec_is_text(name) else ZOO[name]
    graph, x, used = prepare(spec, batch=1, graph_mode=mode)  # compile: this machine's cache, built once
    assert used == mode and isinstance(graph, torch.jit.ScriptModule) == (mode == "script")
    assert all(torch.equal(a, b) for a, b in zip(x, spec.example_inputs(1)))
    eager, _, eager_mode = prepare(spec, batch=1, graph_mode=False)
    assert eager_mode == "eager" and not isinstance(eager, torch.jit.ScriptModule)
    with torch.no_grad():
        expected = eager(*x)
        assert close(graph(*x), expected)
        # Traced or exported at batch 1, must still run (and agree) at other batch sizes.
        for batch in (2, 3):
            other = graph(*spec.example_inputs(batch))
            assert other.shape == (batch, OUTPUT_DIM[name])
            assert close(other[:1], expected)


def spec_is_text(name: str) -> bool:
    return len(ZOO[name].inputs) > 1


@pytest.mark.integration
def test_compiled_package_is_built_once_and_reused():
    """A later start loads the package an earlier one built: the cache keeps one package for the
    model, which the later start does not touch (nor add to), and the answers are the same."""
    from packrat.models import compiled

    spec = ZOO["tiny"]
    first, x, _ = prepare(spec, batch=4, graph_mode="compile")  # builds 4, 2 and 1 if this machine lacks them
    packages = [compiled_package(spec, size) for size in (4, 2, 1)]
    cache = sorted(packages[0].parent.glob(f"{spec.name}-*{compiled.SUFFIX}"))
    assert set(packages) <= set(cache)
    built = [package.stat().st_mtime_ns for package in packages]
    second, _, used = prepare(spec, batch=4, graph_mode="compile")
    assert used == "compile" and sorted(packages[0].parent.glob(f"{spec.name}-*{compiled.SUFFIX}")) == cache
    assert [package.stat().st_mtime_ns for package in packages] == built
    with torch.no_grad():
        assert torch.equal(first(*x), second(*x))
        for count in (3, 5, 9):  # padded to a package's size, or run in chunks of 4
            assert close(first(*spec.example_inputs(count)), ZOO["tiny"].build()(*spec.example_inputs(count)))


@pytest.mark.integration
def test_a_shipped_package_is_used_before_the_machines(tmp_path):
    spec = ZOO["tiny"]
    prepare(spec, batch=1, graph_mode="compile")
    own = compiled_package(spec, 1)
    assert compiled_package(spec, 1, str(tmp_path)) == own  # nothing shipped: the machine's cache
    (tmp_path / own.name).write_bytes(own.read_bytes())
    assert compiled_package(spec, 1, str(tmp_path)) == tmp_path / own.name


def test_compiled_package_key_follows_the_model():
    """Another length, or other weights (another source file), is another package."""
    assert compiled_package(ZOO["tiny_text"], 1) != compiled_package(resolve("tiny_text", (8,)), 1)
    assert compiled_package(ZOO["tiny"], 1) != compiled_package(ZOO["tiny_text"], 1)
    assert compiled_package(ZOO["tiny"], 1) != compiled_package(ZOO["tiny"], 2)
    assert compiled_package(ZOO["bert_base"], 8).name.startswith("bert_base-")


@pytest.mark.parametrize("mode", ["compile", "script"])
def test_graph_mode_fallback_warns(mode, tmp_path):
    spec = resolve(f"{THIS}:dict_output", input_shape=(4,))
    assert spec.scriptable  # unknown until tried
    with pytest.warns(UserWarning, match="dict_output"):
        model, x, used = prepare(spec, batch=2, graph_mode=mode, compile_cache=str(tmp_path))
    assert used == "eager"
    assert model(*x)["out"].shape == (2, 2)


def test_script_mode_shows_torch_deprecation_but_a_users_file_does_not(tmp_path):
    with pytest.warns(DeprecationWarning, match="torch.jit"):
        prepare(ZOO["tiny"], batch=1, graph_mode="script")
    path = tmp_path / "users.pt"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(ZOO["tiny"].build()), str(path))
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        _, _, used = prepare(resolve(str(path), (3, 32, 32)), batch=1)
    assert used == "script"


def test_inception_blocks_are_fx_traceable():
    model = ZOO["inception_v3"].build()
    graph = torch.fx.symbolic_trace(model)
    cats = [n for n in graph.graph.nodes if n.target is torch.cat]
    assert len(cats) == 11  # 3 A + 1 B + 4 C + 1 D + 2 E


# --- resolve() -----------------------------------------------------------------------------


@pytest.mark.slow
def test_resolve_zoo_name_and_shape_override():
    assert resolve("tiny") is ZOO["tiny"]
    short = resolve("bert_base", input_shape=(16,))
    assert short.input_shape == (16,) and ZOO["bert_base"].input_shape == (128,)
    assert [spec.shape for spec in short.inputs] == [(16,)] * 3  # ids, mask and type ids alike
    with torch.no_grad():
        assert short.build()(*short.example_inputs(1)).shape == (1, 768)


def test_resolve_torchscript_file(tmp_path):
    path = tmp_path / "my_tiny.pt"
    torch.jit.save(torch.jit.script(ZOO["tiny"].build()), str(path))
    spec = resolve(str(path), input_shape=(3, 32, 32))
    assert (spec.name, spec.input_dtype, spec.scriptable, spec.task) == (
        "my_tiny", torch.float32, True, "classification")
    x = spec.example_input(2)
    with torch.no_grad():
        expected = ZOO["tiny"].build()(x)
        assert close(spec.build()(x), expected)
        graph, x2, mode = prepare(spec, batch=2)
        assert mode == "script" and close(graph(*x2), expected)


def test_resolve_factory_with_shape():
    spec = resolve("packrat.models.tiny:tiny", input_shape=(3, 32, 32))
    assert spec.input_shape == (3, 32, 32) and spec.input_dtype == torch.float32
    with torch.no_grad():
        assert torch.equal(spec.build()(spec.example_input(2)), ZOO["tiny"].build()(spec.example_input(2)))
    graph, x, mode = prepare(spec, batch=2, graph_mode="script")
    assert mode == "script" and graph(*x).shape == (2, 10)


def test_resolve_factory_with_own_example_input():
    spec = resolve(f"{THIS}:tiny_with_example")
    assert spec.input_shape == (3, 32, 32) and spec.input_dtype == torch.float32
    assert torch.equal(spec.example_input(4), torch.ones(4, 3, 32, 32))
    _, x, mode = prepare(spec, batch=4, graph_mode="script")
    assert mode == "script" and x[0].shape == (4, 3, 32, 32)


@pytest.mark.parametrize(
    ("spec", "shape", "match"),
    [
        ("foo", None, r"unknown model 'foo': choose one of tiny, tiny_text, trivial, resnet50, .*package\.module:factory"),
        ("missing.pt", (3, 32, 32), "not found"),
        ("/no/such/dir/model.ts", (3, 32, 32), "not found"),
        ("no_such_package_xyz.mod:make", (1,), "cannot load model factory"),
        ("packrat.models.tiny:no_such_factory", (1,), "cannot load model factory"),
        (f"{THIS}:NOT_A_FACTORY", (1,), "not callable"),
        ("packrat.models.tiny:tiny", None, "needs an input shape"),
    ],
)
def test_resolve_errors(spec, shape, match):
    with pytest.raises(ValueError, match=match) as err:
        resolve(spec, input_shape=shape)
    assert "\n" not in str(err.value)


def test_resolve_file_needs_shape(tmp_path):
    path = tmp_path / "m.pt"
    torch.jit.save(torch.jit.script(TinyNet().eval()), str(path))
    with pytest.raises(ValueError, match="input shape"):
        resolve(str(path))



@pytest.mark.parametrize("name", marked(["tiny_text", "bert_base", "gpt2"], pytest.mark.slow, {"bert_base", "gpt2"}))
def test_a_padded_sample_gets_the_answer_it_gets_alone(name):
    """Text of n tokens, run alone unpadded, and padded to the model's length beside another
    sample (on the right for encoders, on the left for GPT-2, masked), gives the same answer."""
    spec = resolve(name, (12,))
    model = spec.build()
    ids = spec.example_inputs(2)[0]
    n, left = 7, spec.task == "language-model"
    real = slice(12 - n, 12) if left else slice(0, n)
    alone_ids = ids[:1, real]
    alone = [alone_ids, torch.ones_like(alone_ids)] + [torch.zeros_like(alone_ids)] * (len(spec.inputs) - 2)
    mask = torch.ones_like(ids)
    mask[0] = 0
    mask[0, real] = 1
    padded_ids = torch.where(mask.bool(), ids, torch.zeros_like(ids))
    padded = [padded_ids, mask] + [torch.zeros_like(ids)] * (len(spec.inputs) - 2)
    with torch.no_grad():
        assert close(model(*padded)[:1], model(*alone))
        assert not close(model(padded_ids, torch.ones_like(ids), *padded[2:])[:1], model(*alone))  # the mask matters


def test_an_archive_ships_the_packages_of_its_first_plan(tmp_path, monkeypatch):
    """Of the cached packages, those of the planned instances' ladders (a package holds the
    weights: a many-core profile's every ⟨t, b⟩ would make a huge archive); all without a plan."""
    from packrat.deploy import archive

    monkeypatch.setenv(COMPILE_CACHE_ENV.name, str(tmp_path))
    spec = ZOO["tiny"]
    for threads, batch in [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (2, 8), (4, 8)]:
        compiled_package(spec, batch, threads=threads).write_bytes(b"")
    shapes = lambda paths: sorted(archive.package_shape(p) for p in paths)  # noqa: E731
    assert shapes(archive.compiled_files(spec, 8, {(1, 4)})) == [(1, 1), (1, 2), (1, 4)]
    assert shapes(archive.compiled_files(spec, 4, None)) == [(1, 1), (1, 2), (1, 4), (2, 1), (2, 2), (2, 4)]
    assert shapes(archive.compiled_files(spec, 8, {(2, 8)})) == [(2, 1), (2, 2), (2, 4), (2, 8)]
