"""The one schema of the `packrat:` settings: what the archive writes is what the engine reads."""

import os
import re
from pathlib import Path

import pytest
import yaml

from packrat.loadtest import env as loadtest_env
from packrat.deploy import archive
from packrat.settings import (
    COMPILE_CACHE_ENV,
    CORES_ENV,
    ENVIRONMENT,
    MAX_BODY_BYTES,
    NODE_DIR_ENV,
    RECOVERY_KEYS,
    TORCH_INDEX_ENV,
    TORCH_SPEC_ENV,
    EstimatorSettings,
    Settings,
)


def test_defaults_live_in_one_place():
    settings = Settings("resnet50")
    assert settings.max_body_bytes == MAX_BODY_BYTES == 16 * 2**20
    assert (settings.max_batch, settings.plan, settings.reconfigure, settings.profiles) == (8, "auto", True, ())
    assert settings.first_batch == 8 and settings.recovery() == {} and settings.codec_limits() == {
        "max_body_bytes": MAX_BODY_BYTES, "truncate_text": False}


def test_a_section_round_trips_through_yaml():
    settings = Settings("tiny", profiles=["profile-0.csv", "profile-1.csv"], max_batch=4, plan_batch=2, cores=1,
                        input_shape=[3, 32, 32], request_timeout_s=30, estimator={"alpha": 0.5})
    section = yaml.safe_load(yaml.safe_dump(settings.to_section()))
    assert Settings.from_section(section) == settings
    assert section["profiles"] == ["profile-0.csv", "profile-1.csv"] and section["input_shape"] == [3, 32, 32]
    assert "max_queue" not in section  # not given: the pool's default applies


def test_strings_from_the_command_line_are_converted():
    """`serve run packrat.ray_serve:app model=tiny max_batch=4 ...` passes every value as a string."""
    settings = Settings.from_section({"model": "tiny", "profiles": "a.csv,b.csv", "max_batch": "4",
                                      "reconfigure": "false", "input_shape": "3,32,32", "hang_factor": "2.5"})
    assert settings.profiles == ("a.csv", "b.csv") and settings.max_batch == 4 and settings.reconfigure is False
    assert settings.input_shape == (3, 32, 32) and settings.hang_factor == 2.5


@pytest.mark.parametrize("section, message", [
    ({"profiles": ["p.csv"]}, "need at least 'model'"),
    ({"model": "tiny", "profile_path": "p.csv"}, r"unknown packrat setting\(s\) \['profile_path'\]"),
    ({"model": "tiny", "max_batch": 0}, "'max_batch' must be >= 1"),
    ({"model": "tiny", "max_batch": 2.5}, "'max_batch' must be int"),
    ({"model": "tiny", "reconfigure": "maybe"}, "'reconfigure' must be bool"),
    ({"model": "tiny", "plan": "thin"}, "'plan' must be one of"),
    ({"model": "tiny", "request_timeout_s": 0}, "'request_timeout_s' must be > 0"),
    ({"model": "tiny", "hang_floor_s": -1}, "'hang_floor_s' must be >= 0"),
    ({"model": "tiny", "estimator": [1, 2]}, "'estimator' must be a mapping"),
    ({"model": "tiny", "estimator": {"alfa": 0.5}}, r"unknown packrat setting\(s\) \['estimator.alfa'\]"),
    ({"model": "tiny", "estimator": {"alpha": 2}}, "'estimator.alpha' must be <= 1"),
    ({"model": "tiny", "estimator": {"window": "ten"}}, "'estimator.window' must be int"),
])
def test_bad_settings_are_refused_with_the_key(section, message):
    with pytest.raises(ValueError, match=message):
        Settings.from_section(section)


def test_model_config_writes_torchserve_batching_and_the_settings():
    settings = Settings("tiny", profiles=["profile.csv"], max_batch=8, hang_floor_s=2.0)
    config = yaml.safe_load(archive.model_config_yaml(settings, max_batch_delay_ms=30))
    assert (config["batchSize"], config["maxBatchDelay"], config["minWorkers"], config["maxWorkers"]) == (8, 30, 1, 1)
    assert Settings.from_section(config["packrat"]) == settings
    assert set(RECOVERY_KEYS) & set(config["packrat"]) == {"hang_floor_s"}


def test_the_stock_handler_gets_default_workers():
    stock = yaml.safe_load(archive.model_config_yaml(Settings("tiny", max_batch=4), handler="stock"))
    assert "minWorkers" not in stock and stock["batchSize"] == 4 and stock["packrat"]["profiles"] == []


def test_the_public_api_loads_on_first_use_without_torch_up_front():
    import subprocess
    import sys

    code = ("import sys, packrat; assert 'torch' not in sys.modules; "
            "plan = packrat.plan([(1, 1, 10.0), (1, 2, 15.0), (2, 2, 9.0)], 2, 2); "
            "assert plan.expected_latency_ms == 9.0, plan; "
            "assert packrat.Settings('tiny').max_batch == 8 and packrat.load_profile and packrat.Engine")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        import packrat
        packrat.nothing  # noqa: B018


# --- the estimator: a typed part of the schema ---------------------------------------------------

def test_the_estimator_is_typed_and_written_as_the_same_mapping():
    settings = Settings.from_section({"model": "tiny", "estimator": {"alpha": "0.5", "window": 3}})
    assert settings.estimator == EstimatorSettings(alpha=0.5, window=3)
    assert settings.to_section()["estimator"] == {"alpha": 0.5, "window": 3, "period_s": 1.0, "hysteresis": 0.15}
    assert Settings("tiny", estimator=EstimatorSettings(period_s=2.0)).estimator.period_s == 2.0
    assert Settings("tiny").estimator is None and "estimator" not in Settings("tiny").to_section()


@pytest.mark.parametrize("flags, message", [
    (["--estimator-alpha", "2"], "argument --estimator-alpha: packrat setting 'estimator.alpha' must be <= 1"),
    (["--estimator-window", "0"], "'estimator.window' must be >= 1"),
    (["--estimator-alfa", "0.5"], "unrecognized arguments: --estimator-alfa"),
])
def test_packrat_archive_refuses_a_bad_estimator_before_writing_anything(tmp_path, capsys, flags, message):
    from packrat.cli.main import main

    with pytest.raises(SystemExit) as info:
        main(["archive", "--model", "tiny", "--export-path", str(tmp_path / "store"), *flags])
    assert info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "store").exists()


# --- environment variables: one registry per side ------------------------------------------------

ROOT = Path(__file__).resolve().parent.parent
REGISTRIES = {"packrat/settings.py", "loadtest/env.py"}
NAME = re.compile("PACKRAT" + r"_[A-Z][A-Z_]*")  # not spelled out here either


def every_variable() -> list:
    return [*ENVIRONMENT, *loadtest_env.VARIABLES]


def test_each_variable_is_declared_once_with_a_type_default_and_doc():
    names = [var.name for var in every_variable()]
    assert len(names) == len(set(names)) and all(NAME.match(name) for name in names)
    assert all(var.doc and var.type for var in every_variable())
    assert CORES_ENV.get({}) is None and CORES_ENV.get({CORES_ENV.name: "3"}) == 3
    assert NODE_DIR_ENV.get({NODE_DIR_ENV.name: ""}) == Path(f"/tmp/packrat-node-{os.getuid()}")
    assert COMPILE_CACHE_ENV.get({}) == Path.home() / ".cache" / "packrat" / "compiled"
    with pytest.raises(ValueError, match=f"{CORES_ENV} must be int"):
        CORES_ENV.get({CORES_ENV.name: "four"})
    assert loadtest_env.TIMEOUT_S.read({}) == 60.0 and loadtest_env.MODEL.read({loadtest_env.MODEL.name: "a"}) == "a"


def test_no_module_outside_the_registries_spells_a_variable_out():
    sources = [p for folder in ("packrat", "handlers", "loadtest", "benchmarks", "tests")
               for p in sorted((ROOT / folder).rglob("*.py"))]
    assert len(sources) > 100
    spelled = {str(p.relative_to(ROOT)): sorted(set(NAME.findall(p.read_text()))) for p in sources
               if p.relative_to(ROOT).as_posix() not in REGISTRIES}
    assert not {path: found for path, found in spelled.items() if found}


def test_setup_sh_defaults_are_the_registrys():
    script = (ROOT / "scripts" / "setup.sh").read_text()
    for var in (TORCH_SPEC_ENV, TORCH_INDEX_ENV):
        assert f"${{{var.name}:-{var.default}}}" in script


# The manual's list of the variables is written from ENVIRONMENT and loadtest's registry when it is
# built (docs/hooks.py); tests/test_manual.py checks that it names every one.
