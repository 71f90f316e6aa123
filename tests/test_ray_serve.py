"""The Ray Serve front end on a real two-node Ray cluster on this machine: one node pinned to
core 0, one to core 1, so each engine plans for one core. Both serve, the load is spread over
them, a node whose raylet is killed -9 costs no request (the ingress sends what its engine held
to the other), and its engine comes back with the node."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is an optional extra: pip install 'packrat[ray]'")

from packrat.deploy.ray_local import LocalCluster  # noqa: E402
from packrat.deploy.torchserve import free_port  # noqa: E402

pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or shutil.which("taskset") is None,
                                 reason="two pinned nodes need two cores and taskset")]

PROFILE = "# model: tiny\n# mode: script\nthreads,batch,latency_ms\n" + "".join(
    f"{t},{b},{b * 2.0 / t ** 0.5}\n" for t in (1, 2) for b in (1, 2, 4))


def wait_for(condition, timeout_s: float, what: str, interval_s: float = 0.1):
    """condition()'s first truthy value within timeout_s, else TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout_s:.0f} s")
        time.sleep(interval_s)
    return value


BODY = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 32, 32], "datatype": "FP32",
                               "data": [0.25] * 3072}]}).encode()


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    import ray

    from packrat.frontends import ray_serve

    profile = tmp_path_factory.mktemp("ray") / "tiny.csv"
    profile.write_text(PROFILE)
    with pytest.MonkeyPatch.context() as env:
        # Ray's GCS marks a node dead after 5 failed health checks, one every 3 s: 12.5 s in which it
        # may still place the killed node's engine there. A dead raylet fails each check at once (a
        # live one only after a 10 s timeout), so checks every second find it in 5 s.
        env.setenv("RAY_health_check_period_ms", "1000")
        cluster = LocalCluster([[0], [1]], port=free_port()).start()
    with cluster:
        try:
            url, name = ray_serve.deploy({"model": "tiny", "profiles": [str(profile)], "max_batch": 2},
                                         address=cluster.address, port=free_port(), timeout_s=180)
            yield cluster, url, name
        finally:
            # This process leaves the cluster; Serve is not shut down first, as ray_serve.deployed()
            # would: its graceful shutdown (2 s a deployment) waits for replicas the cluster's stop kills.
            ray.shutdown()


def post(url: str, timeout: float = 30.0) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=BODY, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            response.read()
            return response.status, dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, {"reason": exc.read().decode(errors="replace")[:200]}
    except OSError as exc:
        return 0, {"reason": str(exc)}


class Load:
    """Closed-loop users posting until stopped; every answer recorded as (time, status, headers)."""

    def __init__(self, url: str, users: int):
        self.url, self.answers, self._stop = url, [], threading.Event()
        self._threads = [threading.Thread(target=self._user, daemon=True) for _ in range(users)]
        for thread in self._threads:
            thread.start()

    def _user(self) -> None:
        while not self._stop.is_set():
            status, headers = post(self.url)
            self.answers.append((time.monotonic(), status, headers))

    def stop(self) -> list:
        self._stop.set()
        for thread in self._threads:
            thread.join(60)
        return self.answers

    def nodes_since(self, since: float) -> dict[str, str]:
        """node → its cores, for the engines that answered since `since`."""
        return {h["x-packrat-node"]: h["x-packrat-cores"] for t, status, h in list(self.answers)
                if t >= since and status == 200}


def test_metadata_ready_and_both_nodes_serve_their_own_core(deployed):
    _, url, name = deployed
    with urllib.request.urlopen(f"{url}/v2/models/{name}/ready", timeout=30) as response:
        assert response.status == 200 and json.loads(response.read())["ready"] is True
    with urllib.request.urlopen(f"{url}/v2/models/{name}", timeout=30) as response:
        metadata = json.loads(response.read())
    assert metadata["name"] == name and metadata["inputs"][0]["shape"] == [-1, 3, 32, 32]
    load = Load(f"{url}/v2/models/{name}/infer", users=6)
    try:
        start = time.monotonic()
        nodes = wait_for(lambda: (n := load.nodes_since(start)) and len(n) == 2 and n, 60, "both replicas answering")
    finally:
        answers = load.stop()
    assert sorted(nodes.values()) == ["0", "1"]  # each engine planned for its own node's one core
    assert all(status == 200 for _, status, _ in answers), [a for a in answers if a[1] != 200][:3]


def test_a_v2_client_in_its_default_binary_mode(deployed):
    """tritonclient against the Ray front end: the v2 routes TorchServe 404s, and binary tensors."""
    http = pytest.importorskip("tritonclient.http")
    import numpy as np
    import torch

    from packrat.models.zoo import prepare, resolve

    _, url, name = deployed
    client = http.InferenceServerClient(url.removeprefix("http://"))
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready(name)
    metadata = client.get_model_metadata(name)
    assert metadata["inputs"][0]["shape"] == [-1, 3, 32, 32]
    x = torch.rand(2, 3, 32, 32)
    module, _, _ = prepare(resolve("tiny"), 2, graph_mode="eager")
    with torch.inference_mode():
        want = module(x).numpy()
    given = http.InferInput(metadata["inputs"][0]["name"], [2, 3, 32, 32], "FP32")
    given.set_data_from_numpy(x.numpy())  # binary by default
    result = client.infer(name, [given], outputs=[http.InferRequestedOutput("output0")])
    np.testing.assert_allclose(result.as_numpy("output0"), want, rtol=1e-4, atol=1e-4)


def test_unknown_routes_and_oversized_bodies_are_refused_with_a_reason(deployed):
    _, url, name = deployed
    assert post(f"{url}/predictions/other")[0] == 404
    huge = urllib.request.Request(f"{url}/predictions/{name}", data=b"\0" * (17 * 2**20),
                                  headers={"Content-Type": "application/octet-stream"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(huge, timeout=60)
    assert refused.value.code == 413 and "over" in json.loads(refused.value.read())["message"]
    assert post(f"{url}/predictions/{name}")[0] == 200  # the replica serves on


def test_a_killed_node_costs_no_request_and_its_engine_comes_back(deployed):
    cluster, url, name = deployed
    load = Load(f"{url}/v2/models/{name}/infer", users=6)
    try:
        start = time.monotonic()
        nodes = wait_for(lambda: (n := load.nodes_since(start)) and len(n) == 2 and n, 60, "both replicas answering")
        killed = next(node for node, cores in nodes.items() if cores == "1")
        killed_at = time.monotonic()
        cluster.kill_node([1])
        # The node is started again at once, as a new node (`ray start` alone takes seconds): Ray Serve
        # puts the lost engine's replacement there. The load goes on throughout.
        restart = Restart(cluster, [1])
        wait_for(lambda: {n for n, cores in load.nodes_since(killed_at).items() if cores == "1"} - {killed},
                 120, "the replica coming back")
        restart.join()
        time.sleep(max(0.0, killed_at + 10 - time.monotonic()))  # at least 10 s of load since the kill
        after_kill = [a for a in load.answers if a[0] > killed_at]
        failed = [a for a in after_kill if a[1] != 200]
        print(f"after kill -9 of node [1]'s raylet: {len(after_kill)} answers, {len(failed)} failed: "
              f"{[a[2].get('reason') for a in failed][:3]}")
        assert not failed  # what the dead engine held was sent to the other by the ingress
        settled = killed_at + 6  # once Ray Serve has noticed: the dead engine answers no more, the head's serves
        since = load.nodes_since(settled)
        assert killed not in since and "0" in since.values(), since
        back = time.monotonic()
        nodes = wait_for(lambda: (n := load.nodes_since(back)) and len(n) == 2 and n, 60, "both replicas answering")
        assert sorted(nodes.values()) == ["0", "1"] and killed not in nodes  # the new node's engine, and the head's
    finally:
        load.stop()


class Restart(threading.Thread):
    """cluster.add_node(cores) in the background; join() raises what it raised."""

    def __init__(self, cluster: LocalCluster, cores: list[int]):
        super().__init__(daemon=True)
        self.cluster, self.cores, self.error = cluster, cores, None
        self.start()

    def run(self) -> None:
        try:
            self.cluster.add_node(self.cores)
        except Exception as exc:  # handed to join()
            self.error = exc

    def join(self, timeout: float | None = 180) -> None:
        super().join(timeout)
        if self.error is not None:
            raise self.error
