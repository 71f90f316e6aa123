"""What `pip install` puts into site-packages: packrat alone. The folders beside it (handlers/,
loadtest/, ios_scheduler/) install under its name (packrat.handlers, packrat.loadtest,
packrat.ios_scheduler: pyproject's package-dir), and the code imports them by that name, in the
source tree (through the editable install) and from a wheel alike."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
FOLDERS = {folder: name for name, folder in SETUPTOOLS["package-dir"].items()}  # handlers -> packrat.handlers


def packages_here() -> set[str]:
    """Every package of the source tree, by its installed name."""
    found = set()
    for folder in ("packrat", *FOLDERS):
        for init in (ROOT / folder).rglob("__init__.py"):
            parts = init.parent.relative_to(ROOT).parts
            found.add(".".join((FOLDERS.get(parts[0], parts[0]), *parts[1:])))
    return found


def test_pyproject_lists_every_package_under_packrat():
    assert set(SETUPTOOLS["packages"]) == packages_here()
    assert all(name == "packrat" or name.startswith("packrat.") for name in SETUPTOOLS["packages"])


def test_the_installed_names_are_the_ones_imported():
    import packrat.handlers
    import packrat.ios_scheduler
    import packrat.loadtest

    for module in (packrat.handlers, packrat.loadtest, packrat.ios_scheduler):
        assert Path(module.__file__).parent == ROOT / SETUPTOOLS["package-dir"][module.__name__]


@pytest.mark.slow
def test_a_wheel_installs_packrat_alone_and_finds_its_tools(tmp_path):
    """A wheel built from the tree holds packrat alone; installed (pip --target, away from the
    source tree), packrat finds the handler files to archive, the locustfile to run and IOS."""
    source = tmp_path / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for folder in ("packrat", *FOLDERS):
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", str(source), "-w", str(tmp_path / "wheel")],
                   check=True, capture_output=True, timeout=300)
    wheel, = (tmp_path / "wheel").glob("packrat_serve-*.whl")
    target = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(target), str(wheel)], check=True,
                   capture_output=True, timeout=300)
    assert {p.name for p in target.iterdir()} - {"bin"} == {"packrat", wheel.name.split("-py")[0] + ".dist-info"}

    check = ("import sys, packrat, packrat.loadtest.runner as runner, packrat.handlers.common, "
             "packrat.ios_scheduler.schedule\n"
             "from packrat.deploy.archive import HANDLERS\n"
             "assert 'loadtest' not in sys.modules and 'handlers' not in sys.modules\n"
             "print(packrat.__file__, runner.LOCUSTFILE, HANDLERS / 'packrat_handler.py', "
             "packrat.ios_scheduler.schedule.__file__)")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([sys.executable, "-c", check], cwd=elsewhere, env={**os.environ, "PYTHONPATH": str(target)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in done.stdout.split():
        assert Path(path).is_file() and Path(path).is_relative_to(target / "packrat"), path


PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def requirement_name(spec: str) -> str:
    from packaging.requirements import Requirement

    return Requirement(spec).name


def test_the_runtimes_install_with_packrat_under_a_name_of_its_own():
    from packrat.models.runtimes import PACKAGES

    names = {requirement_name(spec) for spec in PROJECT["dependencies"]}
    assert set(PACKAGES.values()) <= names  # openvino, onnxruntime, torch (torch-compile)
    assert {"onnx", "onnxscript"} <= names  # the exporter ONNX Runtime's artefacts are made with
    assert PROJECT["name"] == "packrat-serve"  # "packrat" on the index is another project


def test_the_torch_only_setup_installs_every_dependency_but_the_runtimes():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    snippet = script.split("<<'PY'", 1)[1].split("\n", 1)[1].split("\nPY\n", 1)[0]
    done = subprocess.run([sys.executable, "-c", snippet], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    kept = done.stdout.split("\n")[:-1]
    left_out = [s for s in PROJECT["dependencies"] if s not in kept]
    assert {requirement_name(s) for s in left_out} == {"openvino", "onnxruntime", "onnx", "onnxscript"}
    assert [requirement_name(s) for s in kept][:1] == ["torch"]
