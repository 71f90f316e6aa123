"""User models saved as ``torch.export`` programs (``torch.export.save``, a ``.pt2`` file).

The program says what it takes: its user inputs, in order, each a tensor whose dim 0 is the
batch. That dim must have been exported dynamic (``dynamic_shapes={"x": {0: Dim("batch")}}``)
for one file to serve every batch size; the other dims must be static, or dynamic and fixed by
the input shape the user gives (``--input-shape``), which sets the first input's shape and,
through the program's own size symbols, every input tied to it (a sequence length shared by
the ids and the mask). An input named ``attention_mask`` may be left out of requests (ones),
as may ``token_type_ids`` (zeros), as for the zoo's text models.

The program must return one tensor, or a tuple/list whose first element is a tensor: packrat
serves that first element. Like a TorchScript file, a program is served as a classification
model (its output read as logits).

Safety: ``torch.export.load`` unpickles. In torch 2.13 it reads the weights and constants with
``torch.load(..., weights_only=False)`` and custom objects with ``pickle.loads``, so loading a
``.pt2`` runs whatever code the file asks for. As with a TorchScript file, the model file is the
operator's own: never serve a ``.pt2`` from an untrusted source.
"""

from __future__ import annotations

import functools
import keyword
import logging
import os
import threading
import warnings
import zipfile
from typing import TYPE_CHECKING

import sympy
import torch
import torch.utils._pytree as pytree
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument

from packrat.errors import first_line
from packrat.models.spec import MASK, TOKEN_TYPES, InputSpec

if TYPE_CHECKING:
    from packrat.models.spec import ModelSpec

__all__ = ["ExportedModule", "exported_module", "from_program"]

FILLS = {MASK: "ones", TOKEN_TYPES: "zeros"}
BATCH_HINT = 'export with dynamic_shapes={"<input>": {0: torch.export.Dim("batch")}} (one entry per input)'


class ExportedModule(torch.nn.Module):
    """A loaded program (``ExportedProgram.module()``), called with the spec's inputs as positional
    tensors, returning one tensor. Built through `exported_module`, which gives each program's
    wrapper a forward() with one named parameter per input: packrat's compile mode exports the
    module again with one dynamic_shapes entry per input, which a ``forward(*inputs)`` cannot take.

    The program's own module refuses ``train()``/``eval()`` (``NotImplementedError``): its graph
    fixed train/eval behaviour at export time. So this wrapper's ``train(mode)`` only records the
    flag and does not reach into the program; ``eval()`` is therefore safe to call.
    """

    def __init__(self, program: torch.nn.Module, in_spec: pytree.TreeSpec, count: int, first_of_many: bool) -> None:
        super().__init__()
        self.program = program
        # Plain positional inputs (the usual case) are passed straight through; keyword or nested
        # inputs are rebuilt from the flat tensors with the program's input tree.
        self._in_spec = None if in_spec == pytree.tree_structure((tuple(range(count)), {})) else in_spec
        self._first_of_many = first_of_many
        for module in self.modules():
            module.training = False

    def _run(self, inputs: tuple[torch.Tensor, ...]) -> torch.Tensor:
        if self._in_spec is None:
            args, kwargs = inputs, {}
        else:
            args, kwargs = pytree.tree_unflatten(list(inputs), self._in_spec)
        if torch.jit.is_tracing():
            # `--graph-mode script` traces the program's input guards (shape asserts) into constants;
            # torch warns about each, but the traced graph only ever sees the shapes it was traced at.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                out = self.program(*args, **kwargs)
        else:
            out = self.program(*args, **kwargs)
        return out[0] if self._first_of_many else out

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:  # replaced per program: see _module_class
        return self._run(inputs)

    def train(self, mode: bool = True) -> "ExportedModule":
        self.training = mode  # the program itself keeps the behaviour it was exported with
        return self


@functools.lru_cache(maxsize=None)
def _module_class(names: tuple[str, ...]) -> type[ExportedModule]:
    """An ExportedModule subclass whose forward() takes `names`, in order: a real signature, as
    torch.export reads it (inspect.signature) to match dynamic_shapes to the inputs. `names` are
    checked identifiers (_parameter_names), so the generated source is only ever that line."""
    params = ", ".join(names)
    namespace: dict = {}
    exec(f"def forward(self, {params}):\n    return self._run(({params},))\n", namespace)  # noqa: S102 (names checked)
    forward = namespace["forward"]
    forward.__qualname__ = "ExportedModule.forward"
    return type("ExportedModule", (ExportedModule,), {"forward": forward, "__module__": __name__})


def _parameter_names(names: list[str]) -> tuple[str, ...]:
    """The inputs' names as forward() parameters: input{i} where one is no usable identifier."""
    taken: set[str] = set()
    out = []
    for i, name in enumerate(names):
        usable = name.isidentifier() and not keyword.iskeyword(name) and name not in ("self", *taken)
        out.append(name if usable else f"input{i}")
        taken.add(out[-1])
    if len(set(out)) < len(out):  # a generated input{i} met a real input of that name
        out = [f"input{i}" for i in range(len(names))]
    return tuple(out)


def exported_module(program: torch.nn.Module, names: list[str], in_spec: pytree.TreeSpec,
                    first_of_many: bool) -> ExportedModule:
    """`program` (an ExportedProgram.module()) wrapped: forward(<names>) -> one tensor, in eval mode."""
    cls = _module_class(_parameter_names(names))
    return cls(program, in_spec, len(names), first_of_many).eval()


def from_program(path: str, input_shape: tuple[int, ...] | None = None) -> ModelSpec:
    """A ModelSpec for the torch.export program saved at `path` (``torch.export.save``).

    input_shape, if given, is the first input's shape without the batch dim: it must match the
    program's static dims and sets its dynamic ones (and those of inputs sharing their size
    symbols). Raises ValueError, with a one-line reason, for a missing or unreadable file, a static
    batch dim, dims left dynamic, non-tensor inputs, or an output that is not a tensor.
    """
    from packrat.models.spec import ModelSpec  # noqa: F811 (packrat.models imports this module lazily)

    program = _load(path)
    inputs, batch_note = _inputs(program, path, input_shape)
    in_spec, first_of_many = _call_structure(program, path, len(inputs))
    _warn_if_training(program, path)

    def build() -> torch.nn.Module:
        # A fresh load per build: a fresh module, and the spec itself holds no weights.
        return exported_module(_load(path).module(), [spec.name for spec in inputs], in_spec, first_of_many)

    name = os.path.splitext(os.path.basename(path))[0]
    description = f"torch.export program {path}" + (f" ({batch_note})" if batch_note else "")
    # sources: the compiled package's key covers the file's contents, not just its name
    return ModelSpec(name, build, inputs, True, "classification", description, sources=(path,))


# --- loading -------------------------------------------------------------------------------


class _DeserializeErrors(logging.Filter):
    """torch.export.load logs the archive reader's error with a full traceback, then tries the
    pre-2.7 format and fails with a generic message: drop the log line, keep its error."""

    def __init__(self) -> None:
        super().__init__()
        self.error: BaseException | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if not str(record.msg).startswith("Ran into the following error when deserializing"):
            return True
        if record.exc_info and self.error is None:
            self.error = record.exc_info[1]
        return False


# torch.export.load sets a process-wide deserializer: two threads loading at once (the profiler's
# early builds beside its points) failed with "_CURRENT_DESERIALIZER is already set"
_LOADING = threading.Lock()


def _load(path: str) -> torch.export.ExportedProgram:
    if not os.path.isfile(path):
        raise ValueError(f"model file not found: {path}")
    logger, errors = logging.getLogger("torch.export"), _DeserializeErrors()
    logger.addFilter(errors)
    try:
        with _LOADING:
            return torch.export.load(path)
    except Exception as exc:  # torch raises anything from zipfile, the archive reader or the deserializer
        raise ValueError(f"cannot load torch.export program {path}: {_why(path, exc, errors.error)}") from None
    finally:
        logger.removeFilter(errors)


def _why(path: str, exc: BaseException, logged: BaseException | None) -> str:
    """One line on why `path` did not load: torch's own reason, or what the file is instead."""
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError):
        names = []
    if any("/data/aotinductor/" in name for name in names):
        return ("it is an AOTInductor package (aoti_compile_and_package), not a program: serve the "
                "program saved with torch.export.save instead")
    if str(exc).startswith("We ran into an error when deserializing"):
        # the generic message points at the log line we dropped: say what it said
        return first_line(logged) if logged is not None else "the archive holds no exported program"
    return f"{first_line(exc)} (saved with torch.export.save?)"


# --- inputs --------------------------------------------------------------------------------


def _inputs(program, path: str, input_shape: tuple[int, ...] | None) -> tuple[tuple[InputSpec, ...], str]:
    """The program's user inputs as InputSpecs, and a note on its batch range ("" if any batch)."""
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    users = [spec for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    if not users:
        raise ValueError(f"torch.export program {path} takes no inputs")
    found: list[tuple[str, torch.Tensor]] = []
    for spec in users:
        name = getattr(spec.arg, "name", "?")
        node = placeholders.get(name) if isinstance(spec.arg, TensorArgument) else None
        val = node.meta.get("val") if node is not None else None  # a FakeTensor: shape (SymInts) and dtype
        if not isinstance(val, torch.Tensor):
            kind = type(spec.arg).__name__.removesuffix("Argument").lower() or "non-tensor"
            raise ValueError(f"torch.export program {path}: input {name!r} is a {kind}, not a tensor; "
                             f"packrat serves programs whose inputs are all tensors")
        found.append((name, val))

    ranges = program.range_constraints
    for name, val in found:
        if val.dim() == 0:
            raise ValueError(f"torch.export program {path}: input {name!r} is a scalar; every input needs "
                             f"a batch dim 0")
        if not isinstance(val.shape[0], torch.SymInt):
            raise ValueError(f"torch.export program {path} has a static batch size ({val.shape[0]}) for input "
                             f"{name!r}: {BATCH_HINT}")

    bindings = _bind(found[0], input_shape, ranges, path)
    inputs = []
    for name, val in found:
        shape = []
        for i, dim in enumerate(val.shape[1:], start=1):
            size = _size(dim, bindings)
            if size is None:
                fix = ("give an input shape (--input-shape) to fix it, or re-export with a static size"
                       if input_shape is None else
                       "it is not tied to the first input's sizes, which the input shape sets: re-export it "
                       "with a static size or with the first input's Dim")
                raise ValueError(f"torch.export program {path}: dim {i} of input {name!r} is dynamic "
                                 f"({_sym(dim)}{_range_text(dim, ranges)}): {fix}")
            shape.append(size)
        inputs.append(InputSpec(name, tuple(shape), str(val.dtype).removeprefix("torch."), None, FILLS.get(name)))
    return tuple(inputs), _batch_note(found[0][1].shape[0], ranges)


def _bind(first: tuple[str, torch.Tensor], input_shape, ranges, path: str) -> dict:
    """The first input's size symbols -> the sizes input_shape gives them; checks its static dims."""
    if input_shape is None:
        return {}
    name, val = first
    dims, given = list(val.shape[1:]), tuple(int(d) for d in input_shape)
    if len(given) != len(dims):
        raise ValueError(f"input shape {'x'.join(map(str, given))} has {len(given)} dims but the program's input "
                         f"{name!r} has {len(dims)} (without the batch): {_pattern(dims)}")
    bindings: dict = {}
    for i, (dim, size) in enumerate(zip(dims, given), start=1):
        expr = _expr(dim)
        if expr is not None and getattr(expr, "is_Symbol", False):
            if bindings.get(expr, size) != size:
                raise ValueError(f"input shape {'x'.join(map(str, given))} gives different sizes to dims the program "
                                 f"ties together ({_sym(dim)}) in input {name!r}")
            bound = ranges.get(expr)
            if bound is not None and not (_num(bound.lower) <= size <= _num(bound.upper)):
                raise ValueError(f"input shape: dim {i} of input {name!r} must lie in {_span(bound)} "
                                 f"(as exported), not {size}")
            bindings[expr] = sympy.Integer(size)
    for i, (dim, size) in enumerate(zip(dims, given), start=1):
        actual = _size(dim, bindings)
        if actual is not None and actual != size:
            raise ValueError(f"input shape {'x'.join(map(str, given))} does not match the program's input {name!r} "
                             f"({_pattern(dims)}): dim {i} is {actual}, not {size}")
    return bindings


def _expr(dim):
    return dim.node.expr if isinstance(dim, torch.SymInt) else None


def _size(dim, bindings: dict) -> int | None:
    """A dim's size: a static int, a dynamic dim the bindings fix, or None."""
    if not isinstance(dim, torch.SymInt):
        return int(dim)
    value = _expr(dim).xreplace(bindings)
    return int(value) if value.is_number else None


def _num(value) -> float:
    try:
        return float(value)  # sympy ints and int_oo
    except (TypeError, ValueError):
        return float("inf")


def _span(bound) -> str:
    """A value range as "[2, 64]" or "[0, inf]"."""
    ends = ("inf" if _num(v) == float("inf") else str(int(_num(v))) for v in (bound.lower, bound.upper))
    return "[" + ", ".join(ends) + "]"


def _sym(dim) -> str:
    return str(_expr(dim)) if isinstance(dim, torch.SymInt) else str(dim)


def _pattern(dims) -> str:
    return "x".join(_sym(d) for d in dims) or "scalar"


def _range_text(dim, ranges) -> str:
    bound = ranges.get(_expr(dim))
    return "" if bound is None else f" in {_span(bound)}"


def _batch_note(dim, ranges) -> str:
    bound = ranges.get(_expr(dim))
    if bound is None:
        return ""
    if _num(bound.lower) <= 1 and _num(bound.upper) == float("inf"):
        return ""
    return f"exported for batch sizes in {_span(bound)} only"


# --- calling convention and output --------------------------------------------------------


def _call_structure(program, path: str, count: int) -> tuple[pytree.TreeSpec, bool]:
    """The program's input tree, and whether its output is a tuple/list to take the first of."""
    call = program.call_spec
    if call is None or call.in_spec is None or call.out_spec is None:
        raise ValueError(f"torch.export program {path} has no calling convention (call_spec); re-save it "
                         f"with torch.export.save")
    if call.in_spec.num_leaves != count:
        raise ValueError(f"torch.export program {path} takes {call.in_spec.num_leaves} input values but "
                         f"{count} are tensors; packrat serves programs whose inputs are all tensors")
    outputs = [spec for spec in program.graph_signature.output_specs if spec.kind == OutputKind.USER_OUTPUT]
    out_spec = call.out_spec
    first_of_many = not out_spec.is_leaf()
    if first_of_many and not (out_spec.type in (tuple, list) and out_spec.num_children > 0
                              and out_spec.child(0).is_leaf()):
        kind = getattr(out_spec.type, "__name__", str(out_spec.type))
        raise ValueError(f"torch.export program {path} returns a {kind}: packrat serves a program that returns "
                         f"a tensor, or a tuple/list whose first element is a tensor")
    if not outputs or not isinstance(outputs[0].arg, TensorArgument):
        raise ValueError(f"torch.export program {path}: its (first) output is not a tensor")
    return call.in_spec, first_of_many


def _warn_if_training(program, path: str) -> None:
    """A program exported from a module in training mode keeps batch statistics and dropout."""
    aten = torch.ops.aten
    trains = {aten.batch_norm.default: 5, aten.dropout.default: 2, aten.feature_dropout.default: 2,
              aten.alpha_dropout.default: 2, aten.native_batch_norm.default: 5,
              aten._native_batch_norm_legit.default: 5, aten._native_batch_norm_legit_functional.default: 5}
    for node in program.graph.nodes:
        index = trains.get(node.target) if node.op == "call_function" else None
        if index is not None and len(node.args) > index and node.args[index] is True:
            warnings.warn(f"torch.export program {path} was exported in training mode ({node.target} trains): "
                          f"export the module after .eval()", stacklevel=3)
            return
