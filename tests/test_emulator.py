"""The emulated API server behaves as the real one does where our backends depend on it,
as seen through the official client."""

from __future__ import annotations

import kubernetes.client
import pytest
from kubernetes import watch
from kubernetes.client.rest import ApiException

from tests.support import objects

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


@pytest.fixture
def apis(k8s):
    return (
        kubernetes.client.CoreV1Api(k8s.api_client),
        kubernetes.client.CustomObjectsApi(k8s.api_client),
    )


def trainjob(name: str, labels: dict | None = None) -> dict:
    return {
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"runtimeRef": {"name": "torch-ddp-cpu"}},
    }


def test_server_owned_metadata_selectors_and_optimistic_concurrency(k8s, apis):
    core, custom = apis
    created = custom.create_namespaced_custom_object(
        GROUP, VERSION, "default", "trainjobs", trainjob("a", {"team": "x"})
    )
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", trainjob("b"))
    meta = created["metadata"]
    assert meta["uid"] and meta["resourceVersion"] and meta["generation"] == 1
    by_label = custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", "trainjobs", label_selector="team in (x,y)"
    )
    by_name = custom.list_namespaced_custom_object(
        GROUP, VERSION, "default", "trainjobs", field_selector="metadata.name=b"
    )
    assert [i["metadata"]["name"] for i in by_label["items"]] == ["a"]
    assert [i["metadata"]["name"] for i in by_name["items"]] == ["b"]
    config = core.create_namespaced_config_map("default", {"metadata": {"name": "c"}})
    config.data = {"k": "v"}
    replaced = core.replace_namespaced_config_map("c", "default", config)
    with pytest.raises(ApiException) as stale:
        core.replace_namespaced_config_map("c", "default", config)  # an old resourceVersion
    assert stale.value.status == 409 and replaced.data == {"k": "v"}


def test_status_is_a_subresource(k8s, apis):
    _, custom = apis
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", trainjob("a"))
    ignored = {"status": {"conditions": [objects.condition("Complete")]}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", "a", ignored)
    assert "status" not in k8s.emulator.get("trainjobs", "a")
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, "default", "trainjobs", "a", ignored
    )
    assert k8s.emulator.get("trainjobs", "a")["status"]["conditions"][0]["type"] == "Complete"


def test_watch_resumes_expires_and_ends_with_a_bookmark(k8s, apis):
    _, custom = apis
    emulator = k8s.emulator
    listing = custom.list_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs")
    since = listing["metadata"]["resourceVersion"]
    custom.create_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs", trainjob("a"))
    events = list(
        watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "default",
            "trainjobs",
            resource_version=since,
            timeout_seconds=1,
            allow_watch_bookmarks=True,
        )
    )
    assert [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    emulator.expire_watches()
    with pytest.raises(ApiException) as gone:
        for _ in watch.Watch().stream(
            custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            "default",
            "trainjobs",
            resource_version=since,
            timeout_seconds=1,
        ):
            pass
    assert gone.value.status == 410


def test_pod_logs_previous_tail_and_follow(k8s, apis):
    core, _ = apis
    emulator = k8s.emulator
    pod = emulator.create_pod(objects.node_pod("job", 0))["metadata"]["name"]
    with pytest.raises(ApiException) as waiting:
        core.read_namespaced_pod_log(pod, "default")
    assert waiting.value.status == 400 and "waiting to start" in waiting.value.body
    running = objects.container_status("img", objects.running())
    emulator.set_pod_status(pod, objects.pod_status("Running", [running]))
    emulator.append_log(pod, ["one", "two", "three"])
    restarted = objects.container_status("img", objects.terminated(0), restart_count=1)
    emulator.set_pod_status(pod, objects.pod_status("Succeeded", [restarted]))

    def read(**params) -> bytes:
        return core.read_namespaced_pod_log(pod, "default", _preload_content=False, **params).data

    assert read(previous=True, tail_lines=2) == b"two\nthree\n"
    assert read() == b""
    assert read(follow=True) == b"", "the container has ended: the stream ends at once"


def test_garbage_collection_follows_propagation_policy(k8s, apis):
    emulator = k8s.emulator
    job = emulator.create("jobs", {"metadata": {"name": "j"}, "spec": {}})
    emulator.create_pod(objects.node_pod("j", 0, kind="job", owner=job))
    emulator.delete("jobs", "j", policy="")  # batch Jobs orphan their pods by default
    assert len(emulator.names("pods")) == 1
    job = emulator.create("jobs", {"metadata": {"name": "k"}, "spec": {}})
    emulator.create_pod(objects.node_pod("k", 0, kind="job", owner=job))
    emulator.delete("jobs", "k", policy="Foreground")
    assert len(emulator.names("pods")) == 1


def test_deleting_a_crd_stops_serving_it(k8s, apis):
    _, custom = apis
    k8s.emulator.delete("customresourcedefinitions", "trainjobs.trainer.kubeflow.org", None)
    with pytest.raises(ApiException) as missing:
        custom.list_namespaced_custom_object(GROUP, VERSION, "default", "trainjobs")
    assert missing.value.status == 404


def test_a_watch_that_comes_while_the_server_shuts_down_is_dropped_at_once(k8s):
    """A client thread racing its own stop can open a watch after the server closed the open
    ones: it is dropped at once, not served to its timeout (the emulator's stop would wait
    that long: 30 s of a test's teardown, seen in the suite)."""
    import urllib3

    k8s.emulator.call(k8s.emulator.api.shut_down)
    core = kubernetes.client.CoreV1Api(k8s.api_client)
    try:
        list(
            watch.Watch().stream(
                core.list_namespaced_pod, "default", timeout_seconds=60, _request_timeout=(5, 8)
            )
        )
    except urllib3.exceptions.ReadTimeoutError:
        pytest.fail("the watch was served on, not dropped")
    except urllib3.exceptions.ProtocolError:
        pass  # dropped: the connection ends without a chunked body's end
