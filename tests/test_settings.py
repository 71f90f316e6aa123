"""The one schema of the `packrat:` settings: what the archive writes is what the engine reads."""

import pytest
import yaml

from packrat.deploy import archive
from packrat.settings import MAX_BODY_BYTES, RECOVERY_KEYS, Settings


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
    ({"model": "tiny", "request_timeout_s": -1}, "'request_timeout_s' must be >= 0"),
    ({"model": "tiny", "estimator": [1, 2]}, "'estimator' must be dict"),
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


def test_async_worker_hands_requests_over_one_by_one_and_the_stock_handler_gets_default_workers():
    settings = Settings("tiny", profiles=["profile.csv"], max_batch=8)
    config = yaml.safe_load(archive.model_config_yaml(settings, async_worker=True))
    assert (config["batchSize"], config["maxBatchDelay"], config["asyncCommunication"]) == (1, 1, True)
    assert config["packrat"]["max_batch"] == 8  # the pool still batches up to 8
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
