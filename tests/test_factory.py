"""The informer factory and the listers: one informer per resource, sync with a timeout."""

from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest
from kubernetes import client

from informers.factory import SharedInformerFactory
from informers.listers import NamespacedLister
from informers.objects import KubeObject
from informers.resource import CONFIG_MAPS, GPU_CLAIMS, NODES, PODS
from informers.store import IndexConflictError, Indexer
from informers.testing import make_object
from tests.helpers import wait_for


def offline_client(host: str = "https://127.0.0.1:1") -> client.ApiClient:
    # Port 1 refuses connections: nothing here may need a server.
    return client.ApiClient(client.Configuration(host=host))


@pytest.fixture
def offline_factory() -> Iterator[SharedInformerFactory]:
    factory = SharedInformerFactory(offline_client())
    yield factory
    factory.shutdown()


def by_node(obj: KubeObject) -> list[str]:
    return [obj.get("spec", {}).get("nodeName", "")]


def test_every_user_of_a_resource_gets_the_same_informer(offline_factory: SharedInformerFactory) -> None:
    pods = offline_factory.informer_for(PODS)
    assert offline_factory.informer_for(PODS) is pods
    assert offline_factory.informer_for(NODES) is not pods
    assert offline_factory.pods()._indexer is pods.indexer
    assert set(offline_factory.informers()) == {PODS, NODES}


def test_indexers_asked_for_by_several_users_are_added_once(offline_factory: SharedInformerFactory) -> None:
    inf = offline_factory.informer_for(PODS, indexers={"node": by_node})
    offline_factory.informer_for(PODS, indexers={"node": by_node})
    assert set(inf.indexer.indexers()) == {"namespace", "node"}
    with pytest.raises(IndexConflictError):
        offline_factory.informer_for(PODS, indexers={"node": lambda o: []})


def test_wait_for_cache_sync_gives_up_after_its_timeout_when_the_server_is_unreachable(
    offline_factory: SharedInformerFactory,
) -> None:
    offline_factory.informer_for(PODS)
    offline_factory.start()
    started = time.monotonic()
    assert offline_factory.wait_for_cache_sync(0.5) == {PODS: False}
    assert time.monotonic() - started < 5


def test_start_starts_informers_asked_for_after_an_earlier_start(offline_factory: SharedInformerFactory) -> None:
    pods = offline_factory.informer_for(PODS)
    offline_factory.start()
    nodes = offline_factory.informer_for(NODES)
    assert pods.started and not nodes.started
    offline_factory.start()
    assert nodes.started


def test_shutdown_stops_informers_that_are_retrying(offline_factory: SharedInformerFactory) -> None:
    inf = offline_factory.informer_for(PODS)
    offline_factory.start()
    wait_for(lambda: inf.reflector.stats.errors >= 1, message="the first failed list")
    started = time.monotonic()
    offline_factory.shutdown()
    assert time.monotonic() - started < 5
    assert not any(t.is_alive() for t in inf._threads)


def test_namespaced_listers_filter_by_namespace_and_labels() -> None:
    store = Indexer()
    store.add(make_object("a", "ns1", labels={"app": "x"}))
    store.add(make_object("b", "ns1", labels={"app": "y"}))
    store.add(make_object("c", "ns2", labels={"app": "x"}))
    lister = NamespacedLister(store)
    assert sorted(o["metadata"]["name"] for o in lister.list("ns1")) == ["a", "b"]
    assert [o["metadata"]["name"] for o in lister.list("ns1", {"app": "x"})] == ["a"]
    assert sorted(o["metadata"]["name"] for o in lister.list(selector={"app": "x"})) == ["a", "c"]
    assert lister.get("ns2", "c") is not None and lister.get("ns1", "c") is None


# -- against the real API server --------------------------------------------


@pytest.mark.plane
def test_listers_read_pods_nodes_and_gpu_claims_from_synced_caches(
    api_client: client.ApiClient, namespace: str, crds: list[str]
) -> None:
    core = client.CoreV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    node_name = f"lister-node-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": node_name, "labels": {"gpu": "yes"}}})
    core.create_namespaced_pod(namespace, {
        "metadata": {"name": "p", "labels": {"app": "train"}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    })
    custom.create_namespaced_custom_object("gpuclaimctl.io", "v1alpha1", namespace, "gpuclaims", {
        "apiVersion": "gpuclaimctl.io/v1alpha1", "kind": "GPUClaim",
        "metadata": {"name": "claim-a"}, "spec": {"className": "a100", "count": 2},
    })
    factory = SharedInformerFactory(api_client, namespace=namespace)
    try:
        pods, nodes, claims = factory.pods(), factory.nodes(), factory.gpu_claims()
        factory.gpu_classes()
        factory.gpu_claim_templates()
        factory.start()
        assert all(factory.wait_for_cache_sync(30).values())
        assert set(factory.informers()) >= {PODS, NODES, GPU_CLAIMS}
        pod = pods.get(namespace, "p")
        assert pod is not None and "managedFields" not in pod["metadata"]
        assert [p["metadata"]["name"] for p in pods.list(namespace, {"app": "train"})] == ["p"]
        node = nodes.get(node_name)
        assert node is not None and nodes.list({"gpu": "yes"})[0]["metadata"]["name"] == node_name
        claim = claims.get(namespace, "claim-a")
        assert claim is not None and claim["spec"] == {"className": "a100", "count": 2, "reclaimPolicy": "Release"}
        # Later changes reach the listers through the shared informers.
        custom.delete_namespaced_custom_object("gpuclaimctl.io", "v1alpha1", namespace, "gpuclaims", "claim-a")
        wait_for(lambda: claims.get(namespace, "claim-a") is None, message="the claim's delete")
    finally:
        factory.shutdown()
        core.delete_node(node_name)


@pytest.mark.plane
def test_a_namespaced_factory_sees_only_its_namespace(api_client: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "mine"}})
    factory = SharedInformerFactory(api_client, namespace=namespace)
    try:
        inf = factory.informer_for(CONFIG_MAPS)
        factory.start()
        assert factory.wait_for_cache_sync(30) == {CONFIG_MAPS: True}
        namespaces = {o["metadata"]["namespace"] for o in inf.indexer.list()}
        assert namespaces == {namespace}
    finally:
        factory.shutdown()
