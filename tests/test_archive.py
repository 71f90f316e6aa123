"""Archives: the settings written are the settings given, the files shipped are the ones named."""

from pathlib import Path

import pytest
import yaml

from packrat.deploy import archive
from packrat.machine import topology
from packrat.settings import CORES_ENV, RECOVERY_KEYS, SERVED_DIR_ENV, Settings

PROFILE = "threads,batch,latency_ms\n1,1,10\n1,2,19\n1,4,37\n2,1,6\n2,2,11\n2,4,21\n"


def packrat_section(text: str) -> dict:
    return yaml.safe_load(text)["packrat"]


@pytest.fixture
def archived(tmp_path, monkeypatch):
    """The model-config.yaml and --extra-files torch-model-archiver would pack, one per build."""
    configs = []

    def fake_tool(cmd):
        configs.append((Path(cmd[cmd.index("--config-file") + 1]).read_text(), cmd[cmd.index("--extra-files") + 1]))

    monkeypatch.setattr(archive, "_run_tool", fake_tool)
    return configs


def test_model_config_yaml_writes_recovery_keys_only_when_given():
    settings = Settings("resnet50", profiles=["profile.csv"])
    assert not set(RECOVERY_KEYS) & set(packrat_section(archive.model_config_yaml(settings)))
    given = settings.replace(request_timeout_s=30.0, max_queue=50, hang_factor=4, hang_floor_s=2.5)
    section = packrat_section(archive.model_config_yaml(given))
    assert {k: section[k] for k in RECOVERY_KEYS if k in section} == \
        {"request_timeout_s": 30.0, "max_queue": 50, "hang_factor": 4, "hang_floor_s": 2.5}
    assert section["max_batch"] == 8  # the rest as before


def test_archive_writes_the_recovery_settings_given(tmp_path, archived):
    profile = tmp_path / "toy.csv"
    profile.write_text(PROFILE)
    archive.build(Settings("tiny", profiles=[profile], max_batch=4), tmp_path)
    archive.build(Settings("tiny", profiles=[profile], max_batch=4, request_timeout_s=60.0, max_queue=10,
                           admission="queue", batch_timeout_s=3.0, hang_factor=8.0, hang_floor_s=1.0), tmp_path)
    assert not set(RECOVERY_KEYS) & set(packrat_section(archived[0][0]))
    section = packrat_section(archived[1][0])
    assert [section[k] for k in RECOVERY_KEYS] == [60.0, 10, "queue", 3.0, 8.0, 1.0]
    assert section["profiles"] == ["profile.csv"]  # named as shipped, not as given
    assert Settings.from_section(section).max_batch == 4


def test_archive_ships_every_profile_and_builds_for_the_one_chosen_here(tmp_path, monkeypatch, archived):
    """Several profiles (one per machine type) ship as profile-0.csv, ...; what the archive builds here
    (compiled packages for the first plan) follows the profile this machine would choose, planned for --cores."""
    compiled = []
    monkeypatch.setattr(archive, "compiled_files", lambda spec, batch, instances: compiled.append(instances) or [])
    monkeypatch.delenv(CORES_ENV.name, raising=False)
    profiles = []
    for index, (cpu, mode) in enumerate((("Other CPU", "compile"), ("This CPU", "eager"))):
        profiles.append(tmp_path / f"p{index}.csv")
        profiles[-1].write_text(f"# cpu: {cpu}\n# cores: 2\n# mode: {mode}\n" + PROFILE)
    monkeypatch.setattr(topology, "cpu_model", lambda: "This CPU")
    archive.build(Settings("tiny", profiles=profiles, max_batch=4, cores=1), tmp_path)
    section = packrat_section(archived[-1][0])
    assert section["profiles"] == ["profile-0.csv", "profile-1.csv"] and section["cores"] == 1
    assert [Path(f).name for f in archived[-1][1].split(",") if "profile" in f] == ["profile-0.csv", "profile-1.csv"]
    assert compiled == []  # this CPU's profile was measured eager: nothing to compile
    monkeypatch.setattr(topology, "cpu_model", lambda: "Other CPU")
    archive.build(Settings("tiny", profiles=profiles, max_batch=4, cores=1), tmp_path)
    assert compiled == [{(1, 4)}]  # the compile profile, planned for the 1 core asked for
    archive.build(Settings("tiny", profiles=profiles[:1], max_batch=4, share_node=False), tmp_path)  # both cores
    section = packrat_section(archived[-1][0])
    assert section["profiles"] == ["profile.csv"] and "cores" not in section and compiled[-1] == {(1, 2), (2, 4)}
    archive.build(Settings("tiny", profiles=profiles[:1], max_batch=4), tmp_path)  # sharing the node, the default
    assert compiled[-1] == {(1, 2), (2, 4), (1, 4)}  # and the plan for a share of one core


def test_the_stock_handler_archive_needs_no_profile_and_a_packrat_one_does(tmp_path, archived):
    archive.build(Settings("tiny", max_batch=2), tmp_path, handler="stock")
    assert packrat_section(archived[-1][0])["profiles"] == []
    with pytest.raises(Exception, match="needs a profile"):
        archive.build(Settings("tiny", max_batch=2), tmp_path)


def test_the_archive_ships_compiled_packages_only_for_the_mode_served(tmp_path, monkeypatch, archived):
    """The stock handler told to run eager (as the demo's eager profile is) gets no packages built or shipped."""
    compiled = []
    monkeypatch.setattr(archive, "compiled_files", lambda spec, batch, instances: compiled.append(instances) or [])
    archive.build(Settings("tiny", max_batch=2, graph_mode="eager"), tmp_path, handler="stock")
    assert compiled == []
    archive.build(Settings("tiny", max_batch=2), tmp_path, handler="stock")  # the default mode: compile
    assert len(compiled) == 1


def test_a_node_archive_ships_the_packages_of_every_share_the_node_may_give(tmp_path):
    from packrat.profiling.profiles import load

    path = tmp_path / "p.csv"
    # a fixed cost per batch: on 4 cores one fat instance is best; on 1 core, ⟨1 thread, batch 4⟩
    path.write_text("threads,batch,latency_ms\n" + "".join(
        f"{t},{b},{10 + b * 8.0 / t}\n" for t in (1, 2, 4) for b in (1, 2, 4)))
    profile = load(path)
    alone = archive.planned_instances(profile, 4, "packrat", 4)
    shared = archive.planned_instances(profile, 4, "packrat", 4, node=True)
    assert (4, 4) in alone and (1, 4) not in alone
    assert alone < shared and (1, 4) in shared  # the plan on one core, the share of a crowded node


def test_torchserve_queue_holds_what_the_deadline_admits_at_the_predicted_batch_time(tmp_path, archived):
    """The plan for B = 4 on 2 cores, 2 × ⟨1 thread, batch 2⟩, is predicted at 19 ms, sized for 4
    times that: a 0.8 s deadline admits 4 × (floor(0.8 / 0.076) − 1) = 36 queued in TorchServe."""
    profile = tmp_path / "toy.csv"
    profile.write_text(PROFILE)
    for timeout, max_queue, admission in ((0.8, None, None), (0.8, 20, None), (0.04, None, None), (0.8, 20, "queue")):
        archive.build(Settings("tiny", profiles=[profile], max_batch=4, cores=2, request_timeout_s=timeout,
                               max_queue=max_queue, admission=admission), tmp_path)
    sizes = [yaml.safe_load(text).get("jobQueueSize") for text, _ in archived]
    assert sizes == [36, 20, 4, 20]  # the prediction; within the bound; at least a batch; queue: the bound
    assert yaml.safe_load(archive.model_config_yaml(Settings("tiny"), handler="stock")).get("jobQueueSize") is None


def test_torchserve_queue_follows_the_pace_a_handler_served_the_model_at(tmp_path, archived, monkeypatch):
    """A handler that served `tiny` a full batch of 4 every 0.1 s remembered it: at a 0.8 s deadline
    its next archive holds 4 × (floor(0.8 / (0.1 × 4/3)) − 1) = 20, not the profile's 36; a pace
    faster than the profile's sizing leaves it; another name, or a day later, has none."""
    import time

    from packrat.frontends import torchserve_control

    monkeypatch.setenv(SERVED_DIR_ENV.name, str(tmp_path / "served"))
    profile = tmp_path / "toy.csv"
    profile.write_text(PROFILE)
    settings = Settings("tiny", profiles=[profile], max_batch=4, cores=2, request_timeout_s=0.8)
    torchserve_control.remember_queue_pace(tmp_path / "served", "tiny", 4, 0.1)
    archive.build(settings, tmp_path)
    torchserve_control.remember_queue_pace(tmp_path / "served", "tiny", 4, 0.01)
    archive.build(settings, tmp_path)
    archive.build(settings, tmp_path, name="other")
    assert [yaml.safe_load(text).get("jobQueueSize") for text, _ in archived] == [20, 36, 36]
    assert torchserve_control.remembered_queue_pace(tmp_path / "served", "tiny", 4, now=time.time() + 2 * 86400) is None
