"""Compiled models as AOTInductor packages: built once per model, thread count and batch size, loaded in milliseconds.

`torch.compile` compiles in every process that runs it (20–30 s for ResNet-50 here, and still
as long with inductor's caches warm, since dynamo traces again), so an instance that is respawned
or started by a reconfiguration would wait for it. Instead the model is exported
(``torch.export``) and compiled ahead of time by inductor, with frozen weights and
kernels that read the thread count at run time (``cpp.dynamic_threads``), into one package per
thread count and batch size; later processes only load the packages' shared libraries, faster
than tracing TorchScript.

Shapes are static: a dynamic batch dimension measured 1.34–1.47× slower at batch 1 (ResNet-50,
2 threads: 63–69 vs 47 ms; BENCHMARKS.md, issue 17). The thread count the package is built with
matters too, run-time threads or not: a ResNet-50 package built with 2 threads ran 161–181 ms at
1 thread, one built with 1 thread 88 ms (TorchScript 102 ms). So the key holds the thread count.
An instance of batch b therefore loads the packages of its halving ladder b, b/2, …, 1 (the sizes
its warm-up runs) and runs k samples on the smallest size ≥ k, the extra rows filled with copies
of the last sample and their outputs dropped (more than b: in chunks of b). A plan hands each
instance its b samples, so padding happens only below full load.

A package is named by a key over everything its code depends on: the model's source (the code
files that define it and its weights), its inputs, the torch version and the CPU's instruction
set (inductor compiles for the CPU it runs on), and by its thread count and batch size. A package that is missing
is built under a file lock, so instances starting together build it once and the others wait.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
from pathlib import Path

from packrat.settings import COMPILE_CACHE_ENV

SUFFIX = ".aoti.pt2"
KEY_CHARS = 16


def default_cache_dir() -> Path:
    """COMPILE_CACHE_ENV's folder (packrat.settings: default ~/.cache/packrat/compiled)."""
    return COMPILE_CACHE_ENV.get()


def package_key(name: str, sources: tuple[str, ...], inputs: tuple) -> str:
    """What the package's generated code depends on, hashed: the model's source files (their
    contents, so a copy in an archive keeps its key), its inputs, torch and the CPU."""
    import torch

    digest = hashlib.sha256()
    for part in (name, repr(inputs), torch.__version__, _cpu_flags()):
        digest.update(part.encode() + b"\0")
    for source in sources:
        _hash_path(digest, Path(source))
    return digest.hexdigest()[:KEY_CHARS]


def package_path(cache_dir: str | os.PathLike, name: str, key: str, threads: int, batch: int) -> Path:
    return Path(cache_dir) / f"{name}-{key}-t{threads}-b{batch}{SUFFIX}"


def ladder(batch: int, full: bool = True) -> list[int]:
    """The batch sizes an instance of `batch` keeps packages for: batch, batch // 2, ..., 1; not
    `full`, `batch` alone (a profile point: every call has `batch` samples)."""
    if not full:
        return [batch]
    sizes = []
    while batch >= 1:
        sizes.append(batch)
        batch //= 2
    return sizes


def load_or_build(module, examples: tuple, path: Path) -> Package:
    """The package at `path` loaded, built first from `module` (at the batch size of `examples`)
    if it is not there yet."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with locked(path):
        if not path.exists():
            build(module, examples, path)
    return Package(path)


def build(module, examples: tuple, path: Path) -> None:
    """Export `module` at the shapes of `examples` and compile it ahead of time into `path`."""
    import torch

    with torch.no_grad():
        program = torch.export.export(module, examples)
        if not program.call_spec.out_spec.is_leaf():  # a package's outputs come back flattened
            raise ValueError("compile mode serves models that return one tensor")
        partial = path.with_name(f".partial-{os.getpid()}-{path.name}")  # the packager wants .pt2
        try:
            torch._inductor.aoti_compile_and_package(
                program, package_path=str(partial),
                inductor_configs={"freezing": True, "cpp.dynamic_threads": True})
            os.replace(partial, path)  # whole or absent: a reader never sees half a package
        finally:
            partial.unlink(missing_ok=True)


class Package:
    """A loaded package, called like the module at its batch size: positional tensors in, one tensor out."""

    def __init__(self, path: Path):
        import torch

        self.path = path
        # The C++ loader itself: torch._inductor.aoti_load_package wraps it for pytree inputs, but
        # importing that wrapper costs about a second of inductor imports, the start we save here.
        self._loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def __call__(self, *inputs):
        # boxed_run takes its list's tensors (and empties it): a fresh list every call
        return self._loader.boxed_run([x.contiguous() for x in inputs])[0]


class Ladder:
    """Packages for several batch sizes, called like the module with any number of samples."""

    def __init__(self, packages: dict[int, Package]):
        self.packages = dict(sorted(packages.items()))
        self.largest = max(self.packages)

    def __call__(self, *inputs):
        import torch

        count = inputs[0].shape[0]
        if count > self.largest:
            chunks = [self(*(x[i:i + self.largest] for x in inputs)) for i in range(0, count, self.largest)]
            return torch.cat(chunks)
        size = next(size for size in self.packages if size >= count)
        if size > count:  # copies of the last sample: real inputs, whose outputs are dropped
            inputs = [torch.cat([x, x[-1:].expand(size - count, *x.shape[1:])]) for x in inputs]
        return self.packages[size](*inputs)[:count]


@contextlib.contextmanager
def locked(path: Path):
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _hash_path(digest, path: Path) -> None:
    """A file's contents, or a directory's files (names and contents) in sorted order."""
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode() + b"\0")
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)


def _cpu_flags() -> str:
    """The CPU's instruction-set flags: a package built for AVX-512 must not run on AVX2."""
    import platform

    from packrat.machine.topology import cpuinfo

    return cpuinfo("flags") or platform.machine()
