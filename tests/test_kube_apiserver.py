"""The Kubernetes API stand-in (tests/kube_apiserver.py) keeps the conventions the controller
relies on: checked through the same client library the controller uses, and with kubectl."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator

import pytest
from etcd_util import EtcdCluster, etcd_available
from kube_apiserver import KubeAPI, namespace, pod

pytestmark = pytest.mark.skipif(not etcd_available(), reason="needs root and /usr/bin/etcd (Debian etcd-server)")

kubernetes = pytest.importorskip("kubernetes")


@pytest.fixture(scope="module")
def api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeAPI]:
    with EtcdCluster(size=1, subnet="10.231.131.0/24", prefix="pk31") as cluster:
        with KubeAPI(cluster, tokens={"admin-token": {"*"}, "nodes-only": {"nodes"}},
                     bookmark_interval=0.3) as a:
            yield a


def _client(api: KubeAPI, tmp: str, token: str = "admin-token") -> object:
    from kubernetes import config

    return config.new_client_from_config(config_file=api.kubeconfig(os.path.join(tmp, f"{token}.kc"), token))


def _core(api: KubeAPI, tmp: str, token: str = "admin-token") -> object:
    from kubernetes import client

    return client.CoreV1Api(_client(api, tmp, token))


def test_list_pages_share_one_snapshot(api: KubeAPI, tmp_path: str) -> None:
    api.create(namespace("paged"))
    for i in range(5):
        api.create(pod("paged", f"p{i}", {"i": str(i)}))
    assert api.cluster.underlay is not None
    with api.cluster.underlay.enter():
        v1 = _core(api, str(tmp_path))
        first = v1.list_namespaced_pod("paged", limit=2)  # type: ignore[attr-defined]
        api.create(pod("paged", "p9"))  # after the snapshot: not in its later pages
        names = [p.metadata.name for p in first.items]
        cont, pages = first.metadata._continue, 1
        while cont:
            page = v1.list_namespaced_pod("paged", limit=2, _continue=cont)  # type: ignore[attr-defined]
            assert page.metadata.resource_version == first.metadata.resource_version
            names += [p.metadata.name for p in page.items]
            cont, pages = page.metadata._continue, pages + 1
    assert names == [f"p{i}" for i in range(5)] and pages == 3
    # an object's resourceVersion is its key's etcd mod revision
    with api.etcd() as e:
        kv = e.get(api.key("pods", "paged", "p3"))
    assert kv is not None and api.get("pods", "paged", "p3")["metadata"]["resourceVersion"] == str(kv.mod_revision)


def test_watch_from_version_with_bookmarks_then_gone(api: KubeAPI, tmp_path: str) -> None:
    from kubernetes.watch.watch import iter_resp_lines

    api.create(namespace("w"))
    rv = api.create(pod("w", "a"))["metadata"]["resourceVersion"]
    api.patch("pods", "w", "a", {"metadata": {"labels": {"x": "1"}}})
    api.create(pod("w", "b"))
    api.delete("pods", "w", "b")
    assert api.cluster.underlay is not None
    with api.cluster.underlay.enter():
        v1 = _core(api, str(tmp_path))
        resp = v1.list_namespaced_pod("w", watch=True, resource_version=rv,  # type: ignore[attr-defined]
                                      allow_watch_bookmarks=True, timeout_seconds=1, _preload_content=False)
        events = [json.loads(line) for line in iter_resp_lines(resp) if line.strip()]
    seen = [(e["type"], e["object"]["metadata"].get("name")) for e in events]
    assert seen[:3] == [("MODIFIED", "a"), ("ADDED", "b"), ("DELETED", "b")], seen
    marks = [e for e in events if e["type"] == "BOOKMARK"]
    assert marks, "no bookmark within a second at a 0.3 s interval"
    assert int(marks[-1]["object"]["metadata"]["resourceVersion"]) == int(events[2]["object"]["metadata"]
                                                                          ["resourceVersion"])
    # once etcd compacted past it, the same version is 410 Gone: a watch says so in an ERROR event,
    # a continued list with a status
    api.create(pod("w", "c"))
    with api.cluster.underlay.enter():
        first = v1.list_namespaced_pod("w", limit=1)  # type: ignore[attr-defined]
    assert first.metadata._continue
    api.create(pod("w", "d"))  # the store moves past the list's snapshot, which compaction then drops
    api.compact()
    with api.cluster.underlay.enter():
        resp = v1.list_namespaced_pod("w", watch=True, resource_version=rv,  # type: ignore[attr-defined]
                                      timeout_seconds=2, _preload_content=False)
        events = [json.loads(line) for line in iter_resp_lines(resp) if line.strip()]
        assert [(e["type"], e["object"]["code"]) for e in events] == [("ERROR", 410)]
        with pytest.raises(kubernetes.client.ApiException) as gone:
            v1.list_namespaced_pod("w", limit=1, _continue=first.metadata._continue)  # type: ignore[attr-defined]
    assert gone.value.status == 410


def test_tokens_and_conflicts(api: KubeAPI, tmp_path: str) -> None:
    from kubernetes.client import ApiException

    api.create(namespace("auth"))
    assert api.cluster.underlay is not None
    with api.cluster.underlay.enter():
        weak = _core(api, str(tmp_path), "nodes-only")
        with pytest.raises(ApiException) as e:
            weak.list_pod_for_all_namespaces()  # type: ignore[attr-defined]
        assert e.value.status == 403
        weak.list_node()  # type: ignore[attr-defined]
        with pytest.raises(ApiException) as e:
            _core(api, str(tmp_path), "nobody").list_node()  # type: ignore[attr-defined]
        assert e.value.status == 401
        v1 = _core(api, str(tmp_path))
        created = v1.create_namespaced_pod("auth", pod("auth", "p"))  # type: ignore[attr-defined]
        with pytest.raises(ApiException) as e:
            v1.create_namespaced_pod("auth", pod("auth", "p"))  # type: ignore[attr-defined]
        assert e.value.status == 409
        fresh = v1.read_namespaced_pod("p", "auth")  # type: ignore[attr-defined]
        fresh.metadata.labels = {"v": "2"}
        v1.replace_namespaced_pod("p", "auth", fresh)  # type: ignore[attr-defined]
        created.metadata.labels = {"v": "stale"}
        with pytest.raises(ApiException) as e:
            v1.replace_namespaced_pod("p", "auth", created)  # type: ignore[attr-defined]
        assert e.value.status == 409
    assert api.get("pods", "auth", "p")["metadata"]["labels"] == {"v": "2"}


KUBECTL = shutil.which("kubectl")


@pytest.mark.skipif(KUBECTL is None, reason="no kubectl binary on this machine")
def test_kubectl_drives_the_stand_in(api: KubeAPI, tmp_path: str) -> None:
    assert api.cluster.underlay is not None and KUBECTL is not None
    kc = api.kubeconfig(os.path.join(str(tmp_path), "kc"))
    home = os.path.join(str(tmp_path), "home")
    os.makedirs(home)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": home, "KUBECONFIG": kc}

    def kubectl(*args: str, input: str | None = None) -> str:
        return api.cluster.underlay.run([KUBECTL, *args], input=input, env=env).stdout  # type: ignore[union-attr]

    api.create(namespace("kc"))
    kubectl("create", "--validate=false", "-f", "-", input=json.dumps(pod("kc", "web", {"app": "web"})))
    kubectl("label", "-n", "kc", "pod", "web", "tier=front")
    kubectl("label", "namespace", "kc", "team=blue")
    assert api.get("pods", "kc", "web")["metadata"]["labels"] == {"app": "web", "tier": "front"}
    assert api.get("namespaces", "", "kc")["metadata"]["labels"] == {"team": "blue"}
    out = json.loads(kubectl("get", "-n", "kc", "pods", "-o", "json"))
    assert [p["metadata"]["name"] for p in out["items"]] == ["web"]
    kubectl("delete", "-n", "kc", "pod", "web", "--wait=false")
    deadline = time.monotonic() + 5
    while api.get("pods", "kc", "web") is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert api.get("pods", "kc", "web") is None
    assert subprocess.run([KUBECTL, "version", "--client"], capture_output=True).returncode == 0
