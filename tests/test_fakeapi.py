"""The simulation's in-memory API server answers as kube-apiserver would,
and its Writer methods answer as the real Writer does."""

from __future__ import annotations

import copy
import inspect
from datetime import datetime, timezone
from typing import Any, Callable

import orjson
import pytest

from gpuclaimctl.client.kube import ApiError
from gpuclaimctl.client.writer import AlreadyExists, Conflict, NotFound, Writer
from gpuclaimctl.model import api
from gpuclaimctl.model.nodeaffinity import pin_to_node
from tests.sim.fakeapi import (
    CLAIMS, CLASSES, NODES, PODS, WRITER_METHODS, FakeApi, ForcedWrite, RecordedEvent, lost_answer,
)

Obj = dict[str, Any]
NOW = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)


@pytest.fixture
def fake() -> FakeApi:
    return FakeApi(clock=lambda: NOW)


def claim_body(name: str = "c", *, owner: Obj | None = None, **meta: Any) -> Obj:
    body: Obj = {"metadata": {"namespace": "ns", "name": name, **meta},
                 "spec": {"className": "a100", "count": 2}}
    if owner is not None:
        body["metadata"]["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "Pod", "name": owner["metadata"]["name"],
            "uid": owner["metadata"]["uid"], "controller": True}]
    return body


def pod_body(name: str = "p", *, gated: bool = True, **spec: Any) -> Obj:
    body: Obj = {"metadata": {"namespace": "ns", "name": name},
                 "spec": {"containers": [{"name": "main", "image": "train:1"}], **spec}}
    if gated:
        body["spec"]["schedulingGates"] = [{"name": api.SCHEDULING_GATE}]
    return body


def released_pod(pod: Obj, node: str) -> Obj:
    """The controller's release (DESIGN §3): the gate gone, the node pinned, marked placed."""
    out = copy.deepcopy(pod)
    out["spec"]["schedulingGates"] = [g for g in out["spec"].get("schedulingGates") or ()
                                      if g["name"] != api.SCHEDULING_GATE]
    out["spec"]["affinity"] = pin_to_node(out["spec"].get("affinity"), node)
    out["metadata"].setdefault("annotations", {})[api.PLACED_NODE_ANNOTATION] = node
    return out


def with_finalizer(claim: Obj) -> Obj:
    out = copy.deepcopy(claim)
    out["metadata"]["finalizers"] = [api.CLAIM_FINALIZER]
    return out


# -- the same seam as the real Writer -----------------------------------------------


def writer_methods() -> list[str]:
    return sorted(n for n, f in inspect.getmembers(Writer, inspect.isfunction) if not n.startswith("_"))


def test_every_writer_method_is_faked_with_the_same_parameters() -> None:
    assert writer_methods() == sorted(WRITER_METHODS)
    for name in WRITER_METHODS:
        real = list(inspect.signature(getattr(Writer, name)).parameters.values())
        faked = list(inspect.signature(getattr(FakeApi, name)).parameters.values())
        assert [(p.name, p.kind, p.default) for p in faked] == \
               [(p.name, p.kind, p.default) for p in real], name


class CannedClient:
    """What kube.request uses of an ApiClient, answering every request with one status."""

    def __init__(self, status: int, reason: str) -> None:
        data = orjson.dumps({"kind": "Status", "reason": reason, "message": "canned"})
        response = type("Response", (), {"status": status, "data": data})()
        pool = type("Pool", (), {"request": lambda *a, **kw: response})()
        self.rest_client = type("Rest", (), {"pool_manager": pool})()

    def param_serialize(self, method: str, path: str, **kw: Any) -> tuple[Any, ...]:
        return method, "https://api" + path, kw["header_params"], None, []


SAMPLE_POD = pod_body() | {"metadata": {"namespace": "ns", "name": "p", "uid": "u", "resourceVersion": "1"}}
SAMPLE_CLAIM = claim_body(uid="u", resourceVersion="1")
SAMPLE_ARGS: dict[str, tuple[Any, ...]] = {
    "create_claim": (SAMPLE_CLAIM,), "update_claim": (SAMPLE_CLAIM,),
    "update_claim_status": (SAMPLE_CLAIM,),
    "update_class_status": ({"metadata": {"name": "a100", "resourceVersion": "1"}},),
    "update_budget_status": ({"metadata": {"name": "b", "namespace": "ns", "resourceVersion": "1"}},),
    "delete_claim": ("ns", "c", "u"), "list_claims": (), "get_pod": ("ns", "p"), "get_node": ("n",), "get_claim": ("ns", "c"),
    "patch_pod": ("ns", "p", []), "delete_pod": ("ns", "p", "u", "1"),
    "event": (SAMPLE_POD, "Warning", "Capacity", "no node has 2 free GPUs"),
    "evict_pod": ("ns", "p", "u"), "list_disruption_budgets": ("ns",),
    "patch_pod_status": ("ns", "p", {"status": {"conditions": [{"type": "DisruptionTarget", "status": "True"}]}}),
}
ANSWERS = [(404, "NotFound"), (409, "Conflict"), (409, "AlreadyExists"), (422, "Invalid"),
           (500, "InternalError")]


def outcome(call: Callable[[], Any]) -> str:
    try:
        result = call()
    except ApiError as e:
        return f"raises ApiError {e.status}"
    except Exception as e:
        return f"raises {type(e).__name__}"
    return f"returns {type(result).__name__}"


@pytest.mark.parametrize("status,reason", ANSWERS, ids=[f"{s}-{r}" for s, r in ANSWERS])
@pytest.mark.parametrize("method", WRITER_METHODS)
def test_an_error_answer_comes_out_as_it_does_from_the_real_writer(
        fake: FakeApi, method: str, status: int, reason: str) -> None:
    assert set(SAMPLE_ARGS) == set(writer_methods())
    real = Writer(CannedClient(status, reason))  # type: ignore[arg-type]
    fake.inject(method, ApiError(status, reason, "canned"), landed=False)
    args = SAMPLE_ARGS[method]
    assert outcome(lambda: getattr(fake, method)(*copy.deepcopy(args))) == \
           outcome(lambda: getattr(real, method)(*copy.deepcopy(args)))


# -- creates, updates and the resourceVersion ---------------------------------------------


def test_create_fills_what_the_server_sets_and_honours_generate_name(fake: FakeApi) -> None:
    first = fake.create_claim(claim_body(name="", generateName="train-", status={"phase": "Bound"}))
    second = fake.create_claim(claim_body(name="", generateName="train-"))
    m = first["metadata"]
    assert m["name"].startswith("train-") and m["name"] != second["metadata"]["name"]
    assert (m["creationTimestamp"], m["generation"], m["resourceVersion"]) == ("2030-01-02T03:04:05Z", 1, "1")
    assert m["uid"] != second["metadata"]["uid"]
    assert second["metadata"]["resourceVersion"] == "2" == fake.resource_version
    assert "status" not in first  # the status subresource: a create sets no status
    assert first["spec"]["reclaimPolicy"] == "Release" and first["kind"] == api.CLAIM_KIND


def test_a_second_create_of_a_name_is_already_exists(fake: FakeApi) -> None:
    fake.create_claim(claim_body())
    with pytest.raises(AlreadyExists):
        fake.create_claim(claim_body())
    with pytest.raises(ApiError) as e:
        fake.create(CLAIMS, claim_body())
    assert (e.value.status, e.value.reason) == (409, "AlreadyExists")


def test_an_update_at_a_stale_resource_version_conflicts_and_changes_nothing(fake: FakeApi) -> None:
    read = fake.create_claim(claim_body())
    fake.patch(CLAIMS, "ns", "c", lambda c: c["metadata"].setdefault("labels", {}).update(team="a"))
    with pytest.raises(Conflict):
        fake.update_claim(with_finalizer(read))
    stored = fake.get(CLAIMS, "ns", "c")
    assert stored is not None and "finalizers" not in stored["metadata"]
    assert stored["metadata"]["labels"] == {"team": "a"}


def test_the_controller_may_not_update_without_a_resource_version(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    del claim["metadata"]["resourceVersion"]
    with pytest.raises(ForcedWrite):
        fake.update_claim_status(claim | {"status": {"phase": "Pending"}})


def test_an_update_of_a_claim_that_is_gone_is_not_found(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    fake.delete(CLAIMS, "ns", "c")
    with pytest.raises(NotFound):
        fake.update_claim(with_finalizer(claim))


def test_a_claims_spec_is_immutable(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    claim["spec"]["count"] = 1
    with pytest.raises(ApiError) as e:
        fake.update_claim(claim)
    assert (e.value.status, e.value.reason) == (422, "Invalid")
    assert fake.get(CLAIMS, "ns", "c")["spec"]["count"] == 2  # type: ignore[index]


@pytest.mark.parametrize("spec", [{"className": "a100"}, {"className": "a100", "count": 0},
                                  {"className": "", "count": 1}],
                         ids=["no-count", "count-0", "no-class"])
def test_an_invalid_claim_is_refused_at_create(fake: FakeApi, spec: Obj) -> None:
    with pytest.raises(ApiError) as e:
        fake.create_claim({"metadata": {"namespace": "ns", "name": "c"}, "spec": spec})
    assert e.value.status == 422
    assert fake.list(CLAIMS).items == []


def test_update_claim_keeps_the_status_and_update_claim_status_keeps_the_rest(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    bound = copy.deepcopy(claim)
    bound["status"] = {"phase": "Bound", "nodeName": "n1", "reservedFor": [{"name": "p", "uid": "u"}]}
    bound["metadata"]["labels"] = {"ignored": "yes"}
    after = fake.update_claim_status(bound)
    assert after["status"]["phase"] == "Bound" and "labels" not in after["metadata"]
    stale_status = with_finalizer(after) | {"status": {"phase": "Pending"}}
    after = fake.update_claim(stale_status)
    assert after["metadata"]["finalizers"] == [api.CLAIM_FINALIZER]
    assert after["status"]["phase"] == "Bound"
    assert after["metadata"]["generation"] == 1  # metadata alone does not make a new generation


@pytest.mark.parametrize("status", [
    {"phase": "Bound"},
    {"phase": "Bound", "nodeName": "n1", "reservedFor": [{"name": "p", "uid": "1"}, {"name": "q", "uid": "2"}]},
    {"phase": "Gone"},
], ids=["bound-without-node", "two-reservations", "unknown-phase"])
def test_the_claim_status_schema_is_enforced(fake: FakeApi, status: Obj) -> None:
    claim = fake.create_claim(claim_body())
    with pytest.raises(ApiError) as e:
        fake.update_claim_status(claim | {"status": status})
    assert e.value.status == 422


def test_an_update_that_changes_nothing_writes_nothing(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    cursor = fake.cursor(CLAIMS)
    again = fake.update_claim(copy.deepcopy(claim) | {"status": {"phase": "Pending"}})
    assert again["metadata"]["resourceVersion"] == claim["metadata"]["resourceVersion"]
    assert fake.events_after(CLAIMS, cursor) == []


def test_a_gpuclass_is_defaulted_and_its_status_written_at_its_resource_version(fake: FakeApi) -> None:
    cls = fake.create(CLASSES, {"metadata": {"name": "a100"}})
    assert cls["spec"] == {"resourceName": "nvidia.com/gpu", "onCordon": "Move"}
    fake.update_class_status(cls | {"status": {"allocatable": 8}})
    with pytest.raises(Conflict):
        fake.update_class_status(cls | {"status": {"allocatable": 4}})
    assert fake.get(CLASSES, "", "a100")["status"] == {"allocatable": 8}  # type: ignore[index]


# -- deletes, finalizers and preconditions --------------------------------------------------


def test_a_claim_with_a_finalizer_is_marked_and_goes_with_its_last_finalizer(fake: FakeApi) -> None:
    claim = fake.update_claim(with_finalizer(fake.create_claim(claim_body())))
    fake.delete_claim("ns", "c", claim["metadata"]["uid"])
    deleting = fake.get(CLAIMS, "ns", "c")
    assert deleting is not None and deleting["metadata"]["deletionTimestamp"] == "2030-01-02T03:04:05Z"
    with pytest.raises(ApiError) as e:  # no finalizer comes back once deleting
        fake.update_claim(deleting | {"metadata": deleting["metadata"] | {"finalizers": ["x", api.CLAIM_FINALIZER]}})
    assert e.value.status == 422
    deleting["metadata"]["finalizers"] = []
    fake.update_claim(deleting)
    assert fake.get(CLAIMS, "ns", "c") is None
    assert [e.type for e in fake.events_after(CLAIMS, 0)] == ["ADDED", "MODIFIED", "MODIFIED", "DELETED"]


def test_delete_claim_with_another_uid_conflicts_and_a_gone_claim_is_no_error(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    with pytest.raises(Conflict):
        fake.delete_claim("ns", "c", "some-earlier-uid")
    assert fake.get(CLAIMS, "ns", "c") is not None
    fake.delete_claim("ns", "c", claim["metadata"]["uid"])
    fake.delete_claim("ns", "c", claim["metadata"]["uid"])
    assert fake.get(CLAIMS, "ns", "c") is None


def test_delete_claim_given_a_resource_version_holds_to_it(fake: FakeApi) -> None:
    read = fake.create_claim(claim_body())
    uid, rv = read["metadata"]["uid"], read["metadata"]["resourceVersion"]
    fake.patch(CLAIMS, "ns", "c", lambda c: c["metadata"].setdefault("labels", {}).update(team="a"))
    with pytest.raises(Conflict):
        fake.delete_claim("ns", "c", uid, rv)  # it changed since it was read
    assert fake.get(CLAIMS, "ns", "c") is not None
    fake.delete_claim("ns", "c", uid)  # uid alone, as the claim sync deletes
    assert fake.get(CLAIMS, "ns", "c") is None


def test_delete_pod_holds_to_its_uid_and_resource_version(fake: FakeApi) -> None:
    pod = fake.create(PODS, pod_body())
    uid, rv = pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]
    fake.mark_unschedulable("ns", "p", "0/3 nodes are available")
    assert fake.delete_pod("ns", "p", uid, rv) is False  # it changed since it was read
    rv = fake.get(PODS, "ns", "p")["metadata"]["resourceVersion"]  # type: ignore[index]
    assert fake.delete_pod("ns", "p", "other-uid", rv) is False
    assert fake.delete_pod("ns", "p", uid, rv) is True
    assert fake.get(PODS, "ns", "p") is None  # not on a node: gone at once
    assert fake.delete_pod("ns", "p", uid, rv) is False


def test_a_pod_on_a_node_goes_only_when_kubelet_has_stopped_it(fake: FakeApi) -> None:
    fake.create(PODS, pod_body(gated=False))
    fake.bind_pod("ns", "p", "n1")
    pod = fake.set_pod_phase("ns", "p", "Running")
    assert fake.delete_pod("ns", "p", pod["metadata"]["uid"], pod["metadata"]["resourceVersion"])
    terminating = fake.get(PODS, "ns", "p")
    assert terminating is not None and terminating["metadata"]["deletionGracePeriodSeconds"] == 30
    fake.finish_pod_deletion("ns", "p")
    assert fake.get(PODS, "ns", "p") is None


# -- pods: what the API server lets an update change --------------------------------------


def narrowed(pod: Obj) -> Obj:
    out = copy.deepcopy(pod)
    out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"].append({"key": "zone", "operator": "In", "values": ["a"]})
    return out


AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}]}}}
POD_CHANGES: list[tuple[str, bool, Obj, Callable[[Obj], Obj]]] = [
    ("release-without-affinity", True, pod_body(), lambda p: released_pod(p, "n1")),
    ("release-with-affinity", True, pod_body(affinity=AFFINITY), lambda p: released_pod(p, "n1")),
    ("narrow-while-gated", True, pod_body(affinity=AFFINITY), narrowed),
    ("annotations", True, pod_body(gated=False),
     lambda p: p | {"metadata": p["metadata"] | {"annotations": {"a": "b"}}}),
    ("node-selector-added-while-gated", True, pod_body(),
     lambda p: p | {"spec": p["spec"] | {"nodeSelector": {"zone": "a"}}}),
    ("narrow-ungated", False, pod_body(gated=False, affinity=AFFINITY), narrowed),
    ("widen", False, pod_body(affinity=AFFINITY),
     lambda p: p | {"spec": p["spec"] | {"affinity": {}}}),
    ("mutate-a-requirement", False, pod_body(affinity=AFFINITY),
     lambda p: p | {"spec": p["spec"] | {"affinity": {"nodeAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
             {"matchExpressions": [{"key": "gpu", "operator": "DoesNotExist"}]}]}}}}}),
    ("add-a-term", False, pod_body(affinity=AFFINITY),
     lambda p: released_pod(p, "n1") | {"spec": p["spec"] | {"affinity": {"nodeAffinity": {
         "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{}, {}]}}}}}),
    ("add-a-gate", False, pod_body(gated=False),
     lambda p: p | {"spec": p["spec"] | {"schedulingGates": [{"name": "other"}]}}),
    ("node-name", False, pod_body(), lambda p: p | {"spec": p["spec"] | {"nodeName": "n1"}}),
    ("containers", False, pod_body(),
     lambda p: p | {"spec": p["spec"] | {"containers": [{"name": "main", "image": "x"}, {"name": "b"}]}}),
]


@pytest.mark.parametrize("allowed,body,change", [c[1:] for c in POD_CHANGES], ids=[c[0] for c in POD_CHANGES])
def test_a_pod_update_is_allowed_only_as_the_api_server_allows_it(
        fake: FakeApi, allowed: bool, body: Obj, change: Callable[[Obj], Obj]) -> None:
    pod = fake.create(PODS, body)
    wanted = change(copy.deepcopy(pod))
    if allowed:
        assert fake.update_pod(wanted)["spec"] == wanted["spec"]
    else:
        with pytest.raises(ApiError) as e:
            fake.update_pod(wanted)
        assert e.value.status == 422
        assert fake.get(PODS, "ns", "p") == pod


def test_update_pod_ignores_status(fake: FakeApi) -> None:
    pod = fake.create(PODS, pod_body())
    released = fake.update_pod(released_pod(pod, "n1") | {"status": {"phase": "Failed"}})
    assert released.get("status") is None
    assert released["metadata"]["annotations"][api.PLACED_NODE_ANNOTATION] == "n1"


def test_the_scheduler_binds_an_ungated_pod_once_and_reports_unschedulable(fake: FakeApi) -> None:
    fake.create(PODS, pod_body())
    with pytest.raises(ValueError):
        fake.bind_pod("ns", "p", "n1")
    fake.patch(PODS, "ns", "p", lambda p: p["spec"].update(schedulingGates=[]))
    unschedulable = fake.mark_unschedulable("ns", "p", "node(s) had untolerated taint")
    assert unschedulable["status"]["conditions"] == [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable",
                                                      "message": "node(s) had untolerated taint"}]
    bound = fake.bind_pod("ns", "p", "n1")
    assert bound["spec"]["nodeName"] == "n1"
    assert bound["status"]["conditions"] == [{"type": "PodScheduled", "status": "True"}]
    with pytest.raises(ApiError) as e:
        fake.bind_pod("ns", "p", "n2")
    assert e.value.status == 409


# -- faults and interleaving --------------------------------------------------------------


def test_an_answer_lost_after_the_write_landed_leaves_the_write_in_place(fake: FakeApi) -> None:
    fake.inject("create_claim", lost_answer(), landed=True)
    with pytest.raises(TimeoutError):
        fake.create_claim(claim_body())
    assert fake.get(CLAIMS, "ns", "c") is not None
    with pytest.raises(AlreadyExists):  # the retry finds what the lost answer made
        fake.create_claim(claim_body())


def test_a_refused_write_that_did_not_land_changes_nothing_and_the_next_call_is_answered(
        fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    fake.inject("update_claim", ApiError(500, "InternalError", "etcd timeout"), landed=False)
    with pytest.raises(ApiError):
        fake.update_claim(with_finalizer(claim))
    assert "finalizers" not in fake.get(CLAIMS, "ns", "c")["metadata"]  # type: ignore[index]
    assert fake.update_claim(with_finalizer(claim))["metadata"]["finalizers"] == [api.CLAIM_FINALIZER]


def test_an_injected_conflict_on_delete_pod_is_false_as_from_the_real_writer(fake: FakeApi) -> None:
    pod = fake.create(PODS, pod_body())
    fake.inject("delete_pod", ApiError(409, "Conflict", "precondition"), landed=True)
    assert fake.delete_pod("ns", "p", pod["metadata"]["uid"], pod["metadata"]["resourceVersion"]) is False
    assert fake.get(PODS, "ns", "p") is None  # landed all the same


def test_a_write_in_the_hook_makes_the_controllers_write_conflict(fake: FakeApi) -> None:
    claim = fake.create_claim(claim_body())
    seen: list[tuple[str, Obj]] = []

    def user_edits_first(method: str, body: Obj) -> None:
        seen.append((method, body))
        if method == "update_claim_status":
            fake.patch(CLAIMS, "ns", "c", lambda c: c["metadata"].update(labels={"edited": "yes"}))

    fake.before_write = user_edits_first
    with pytest.raises(Conflict):
        fake.update_claim_status(claim | {"status": {"phase": "Pending"}})
    fake.get_pod("ns", "nobody")  # a read: no hook
    assert [m for m, _ in seen] == ["update_claim_status"]
    assert seen[0][1]["status"] == {"phase": "Pending"}
    assert fake.writer_calls == ["create_claim", "update_claim_status", "get_pod"]


def test_events_are_recorded_and_an_event_that_fails_is_not_raised(fake: FakeApi) -> None:
    pod = fake.create(PODS, pod_body())
    fake.event(pod, "Warning", "Capacity", "x" * 2000)
    fake.inject("event", lost_answer(), landed=False)
    fake.event(pod, "Normal", "Placed", "on n1")
    assert fake.events == [RecordedEvent("Pod/ns/p", "Warning", "Capacity", "x" * 1024)]


# -- watch logs ----------------------------------------------------------------------------


def test_each_kind_has_a_watch_log_read_at_any_lag(fake: FakeApi) -> None:
    fake.create(NODES, {"metadata": {"name": "n1"}, "status": {"allocatable": {"nvidia.com/gpu": "8"}}})
    claim = fake.create_claim(claim_body())
    lagging = fake.cursor(CLAIMS)
    listing = fake.list(CLAIMS)
    fake.update_claim(with_finalizer(claim))
    fake.delete_claim("ns", "c", claim["metadata"]["uid"])
    fake.patch(CLAIMS, "ns", "c", lambda c: c["metadata"].update(finalizers=[]))

    events = fake.events_after(CLAIMS, 0)
    assert [(e.position, e.type) for e in events] == [(0, "ADDED"), (1, "MODIFIED"), (2, "MODIFIED"), (3, "DELETED")]
    assert [int(e.obj["metadata"]["resourceVersion"]) for e in events] == [2, 3, 4, 5]
    assert fake.events_after(CLAIMS, lagging) == events[1:]
    assert [e.type for e in fake.events_after(NODES, 0)] == ["ADDED"]
    assert listing.cursor == lagging and listing.resource_version == "2"
    assert [c["metadata"]["name"] for c in listing.items] == ["c"]
    assert fake.list(CLAIMS) == ([], "5", 4)
    events[0].obj["spec"]["count"] = 99  # a copy: the log is not changed through it
    assert fake.events_after(CLAIMS, 0)[0].obj["spec"]["count"] == 2


def test_the_same_steps_give_the_same_names_uids_and_versions() -> None:
    def run() -> list[Any]:
        fake = FakeApi(clock=lambda: NOW)
        for _ in range(3):
            fake.create_claim(claim_body(name="", generateName="c-"))
        return fake.events_after(CLAIMS, 0)

    assert run() == run()


# -- garbage collection ----------------------------------------------------------------------


def test_the_garbage_collector_deletes_the_claims_of_a_deleted_pod_only(fake: FakeApi) -> None:
    pod = fake.create(PODS, pod_body())
    other = fake.create(PODS, pod_body("q"))
    fake.update_claim(with_finalizer(fake.create_claim(claim_body("p-gpu", owner=pod))))
    fake.create_claim(claim_body("q-gpu", owner=other))
    replicaset_owned = claim_body("rs-gpu")
    replicaset_owned["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": "rs-uid"}]
    fake.create_claim(replicaset_owned)
    assert fake.collect_garbage() == []

    fake.delete(PODS, "ns", "p")
    fake.create(PODS, pod_body())  # a new pod of the same name does not own the old claim
    assert fake.collect_garbage() == ["gpuclaims/ns/p-gpu"]
    claim = fake.get(CLAIMS, "ns", "p-gpu")
    assert claim is not None and claim["metadata"].get("deletionTimestamp")  # its finalizer holds it
    assert fake.collect_garbage() == []
    assert {c["metadata"]["name"] for c in fake.list(CLAIMS).items} == {"p-gpu", "q-gpu", "rs-gpu"}
