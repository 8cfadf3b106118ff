"""The controller's RBAC, proven on the real plane (issue 6, item 5).

deploy/'s ServiceAccount, ClusterRole, ClusterRoleBinding and the Lease's
Role and RoleBinding are applied as an operator applies them; the real
`gpuclaimctl run --leader-elect` process then runs with that service
account's token and nothing else, and must do its whole job: place a pod's
set (template and inline claims created, bound, the pod released), remove
a stale reservation, delete a finished pod's template claims, delete a pod
the scheduler refused, preempt a pod of lower priority (its namespace's
PodDisruptionBudgets listed, the Eviction API, a DisruptionTarget condition
patched into its status), write events, hold its Lease, and serve its secure
/metrics to a scraper's token (a TokenReview and a SubjectAccessReview per
token), the way Prometheus scrapes it with deploy/metrics-reader-rbac.yaml.

The API server's audit log (every request of a service account, at
Metadata level) then says which (verb, resource) pairs the controller used.
The roles must grant nothing beyond those, except grants listed in
UNEXERCISED with the reason no request shows them; each reason is checked
by an experiment of its own where one is possible.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import signal
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml
from kubernetes import client, config, utils

from gpuclaimctl.model import api
from gpuclaimctl.client import kube
from gpuclaimctl.controlplane import ControlPlane
from gpuclaimctl.model.podclaims import ClaimEntry, template_claim
from gpuclaimctl.webhook import configurations
from tests.helpers import free_port, gpu_node_manifest, node_is_ready, wait_for
from tests.test_deploy_manifests import (
    DEPLOY,
    SERVICE_ACCOUNT,
    SYSTEM_NAMESPACE,
    kubectl,
    load_yaml_docs,
)
from tests.test_e2e import Cluster
from tests.test_e2e_preemption import (
    DISRUPTION_TARGET,
    GRACE_FINALIZER,
    PREEMPTED_BY_US,
    PRIORITY,
    lift_grace,
)
from tests.test_failover import ControllerProcess, lease_holder

pytestmark = pytest.mark.plane

FIELD_MANAGER = "gpuclaimctl-rbac-test"
RBAC_FILES = ["namespace.yaml", "serviceaccount.yaml", "clusterrole.yaml",
              "clusterrolebinding.yaml", "leader-election-rbac.yaml", "webhook-rbac.yaml"]
# The scraper's role, not the controller's: applied for the story, not audited.
METRICS_READER_FILE = "metrics-reader-rbac.yaml"
# The Lease the Role names; the Deployment's lease name.
LEASE_NAME = "gpuclaimctl"
OWNER_REFERENCES_PLUGIN = "OwnerReferencesPermissionEnforcement"

# (verb, apiGroup, resource, subresource) granted but never seen in a request.
# The informers fill their caches with WatchList (a watch with
# sendInitialEvents, as client-go does by default); `list` is what they fall
# back to when an API server refuses that (tests/test_watchlist.py).
_WATCHLIST_FALLBACK = ("no request uses it while the API server serves WatchList: the informers "
                       "list only when it is refused (see tests/test_watchlist.py)")
UNEXERCISED = {
    **{("list", group, resource, ""): _WATCHLIST_FALLBACK for group, resource in (
        ("", "nodes"), ("", "pods"), ("", "persistentvolumeclaims"), ("", "persistentvolumes"),
        ("gpuclaimctl.io", "gpuclasses"), ("gpuclaimctl.io", "gpuclaimtemplates"),
        ("gpuclaimctl.io", "gpubudgets"), ("", "namespaces"), ("", "resourcequotas"),
        # DRA's (docs/dra.md): the session's plane serves resource.k8s.io/v1.
        ("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "deviceclasses"),
        ("resource.k8s.io", "resourceclaims"), ("resource.k8s.io", "devicetaintrules"))},
    # The session's plane does not serve PodGroups (a feature gate and a
    # beta API); tests/test_podgroup_gangs.py runs the controller as this
    # service account on a plane that does, and shows them read.
    **{(verb, "scheduling.k8s.io", "podgroups", ""): (
        "the session's plane does not serve PodGroups; tests/test_podgroup_gangs.py shows the "
        "grant used where they are served") for verb in ("list", "watch")},
    ("update", "", "pods", "finalizers"): (
        "no request uses it: clusters running the OwnerReferencesPermissionEnforcement "
        "admission plugin check it when the controller creates a template claim owned by "
        "its pod with blockOwnerDeletion; the experiment below shows the create refused "
        "without it"),
}

# Used only when the same event repeats on an object (the recorder then
# patches its count, as client-go's does), only when the webhook's
# namespace cache does not show a default-class label the API server matched
# (a namespace just made or labelled: it reads that one namespace), and only
# when a claim is read live: a bind whose answer was lost, or a count in
# flight for a claim its informer has not shown for 30 s (the audit;
# tests/test_sync_scenarios.py has both); whether a run does any of these
# depends on timing, so neither "unused" nor "used" is asserted for them.
# Claims are listed before a leader's first decision only if its informers
# listed before it took the Lease (a standby taking over; a Lease still
# held by a process of an earlier test): a free Lease is taken first, and
# then nothing is listed (Controller.catch_up, tests/test_takeover.py).
SOMETIMES_USED = {("patch", "", "events", ""), ("get", "", "namespaces", ""),
                  ("get", "gpuclaimctl.io", "gpuclaims", ""), ("list", "gpuclaimctl.io", "gpuclaims", "")}

Access = tuple[str, str, str, str]


def rbac_docs() -> list[dict[str, Any]]:
    return [d for f in RBAC_FILES for d in load_yaml_docs(DEPLOY / f)]


def apply(plane: ControlPlane, docs: list[dict[str, Any]]) -> None:
    kubectl(plane, "apply", "--server-side", f"--field-manager={FIELD_MANAGER}",
            "--force-conflicts", "-f", "-", stdin=yaml.safe_dump_all(docs))


def granted(docs: list[dict[str, Any]]) -> set[Access]:
    """Every (verb, group, resource, subresource) a ClusterRole or Role in docs grants."""
    out: set[Access] = set()
    for doc in docs:
        if doc["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in doc["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    name, _, sub = resource.partition("/")
                    for verb in rule["verbs"]:
                        out.add((verb, group, name, sub))
    return out


def used(events: list[dict[str, Any]]) -> set[Access]:
    out: set[Access] = set()
    for e in events:
        ref = e.get("objectRef")
        if ref:
            out.add((e["verb"], ref.get("apiGroup", ""), ref["resource"],
                     ref.get("subresource", "")))
    return out


def service_account_kubeconfig(plane: ControlPlane, api_client: client.ApiClient,
                               path: Path) -> Path:
    """A kubeconfig holding a token of deploy/'s service account, and nothing else."""
    assert plane.pki is not None
    name = SERVICE_ACCOUNT.rsplit(":", 1)[1]
    wait_for(lambda: _exists(api_client, f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/"
                                         f"serviceaccounts/{name}"),
             timeout=30, message="the service account to exist")
    review = kube.request_json(
        api_client, "POST",
        f"/api/v1/namespaces/{SYSTEM_NAMESPACE}/serviceaccounts/{name}/token",
        body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
              "spec": {"expirationSeconds": 3600}})
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "local", "cluster": {
            "server": plane.server, "certificate-authority": str(plane.pki.ca_cert)}}],
        "users": [{"name": "gpuclaimctl", "user": {"token": review["status"]["token"]}}],
        "contexts": [{"name": "gpuclaimctl", "context": {"cluster": "local",
                                                         "user": "gpuclaimctl"}}],
        "current-context": "gpuclaimctl",
    }))
    return path


def _exists(api_client: client.ApiClient, path: str) -> bool:
    try:
        kube.request(api_client, "GET", path)
        return True
    except kube.ApiError as e:
        if e.status == 404:
            return False
        raise


def namespace_with_default_account(api_client: client.ApiClient, name: str) -> None:
    # Without kube-controller-manager nothing makes the `default` account
    # that pods need; where it runs, it may make it first.
    kube.request(api_client, "POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    try:
        kube.request(api_client, "POST", f"/api/v1/namespaces/{name}/serviceaccounts",
                     body={"metadata": {"name": "default"}})
    except kube.ApiError as e:
        if e.status != 409:
            raise


def _allowed(api_client: client.ApiClient, path: str) -> bool:
    try:
        kube.request(api_client, "GET", path)
        return True
    except kube.ApiError as e:
        # 429: a CRD just created; its storage is still initializing.
        if e.status in (403, 429):
            return False
        raise


def _delete_rbac(plane: ControlPlane, api_client: client.ApiClient) -> None:
    kubectl(plane, "delete", "--ignore-not-found", "--wait=false", "-f", "-",
            stdin=yaml.safe_dump_all(rbac_docs()))
    # The next module that applies deploy/ must not meet a Terminating namespace.
    wait_for(lambda: not _exists(api_client, f"/api/v1/namespaces/{SYSTEM_NAMESPACE}"),
             timeout=60, message=f"namespace {SYSTEM_NAMESPACE} to go")


# -- the stories, as the service account --------------------------------------------


@dataclasses.dataclass
class Stories:
    """What the controller did as its service account, and what the audit log saw."""

    node: str
    placed_claims: dict[str, dict[str, Any]]
    events: dict[str, list[Any]]
    stale_claim: dict[str, Any]
    lease_holder_after_exit: str
    exit_code: int
    audit: list[dict[str, Any]]
    # Preemption: the victim's DisruptionTarget condition (and whether it
    # was terminating then).
    preempted: dict[str, Any] = dataclasses.field(default_factory=dict)
    # Reviews the webhook answered for the pods of the stories.
    admissions: float = 0.0
    # The service account's own kubeconfig (its token lasts an hour).
    kubeconfig: Path | None = None


def _node(api_client: client.ApiClient, name: str, **kw: Any) -> str:
    core = client.CoreV1Api(api_client)
    kube.request(api_client, "POST", "/api/v1/nodes", body=gpu_node_manifest(name, **kw))
    wait_for(lambda: node_is_ready(core, name), timeout=30, message=f"node {name} Ready")
    return name


@pytest.fixture(scope="module")
def stories(full_plane: ControlPlane, api_client: client.ApiClient, crds: list[str],
            tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stories]:
    core = client.CoreV1Api(api_client)
    workdir = tmp_path_factory.mktemp("rbac")
    ns = f"rbac-{uuid.uuid4().hex[:6]}"
    namespace_with_default_account(api_client, ns)
    cluster = Cluster(api_client, ns)
    nodes: list[str] = []
    proc: ControllerProcess | None = None
    reader_docs: list[dict[str, Any]] = []
    urgent = f"rbac-urgent-{ns}"  # a PriorityClass
    apply(full_plane, rbac_docs())
    # The webhook serves on loopback, registered with a url: client config
    # (deploy/'s Service has nobody behind it here) under deploy/'s name,
    # for this namespace's pods alone; its certificate goes into deploy/'s
    # empty Secret.
    webhook_port = free_port()
    mutating, validating = configurations.render(
        {"url": f"https://127.0.0.1:{webhook_port}"}, controller_username=SERVICE_ACCOUNT,
        excluded_namespaces=["kube-system", SYSTEM_NAMESPACE],
        extra_namespace_requirements=[{"key": "kubernetes.io/metadata.name", "operator": "In",
                                       "values": [ns]}])
    apply(full_plane, [d for d in load_yaml_docs(DEPLOY / "webhook.yaml") if d["kind"] == "Secret"]
          + [mutating, validating])
    try:
        kubeconfig = service_account_kubeconfig(full_plane, api_client, workdir / "sa.kubeconfig")
        # Prometheus's stand-in: a service account bound to deploy/'s reader role.
        scraper = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                   "metadata": {"name": f"gpuclaimctl-metrics-reader-{ns}"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                               "name": "gpuclaimctl-metrics-reader"},
                   "subjects": [{"kind": "ServiceAccount", "namespace": ns, "name": "scraper"}]}
        reader_docs = load_yaml_docs(DEPLOY / METRICS_READER_FILE) + [scraper]
        apply(full_plane, reader_docs)
        kube.request(api_client, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts",
                     body={"metadata": {"name": "scraper"}})
        scrape_token = kube.request_json(
            api_client, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts/scraper/token",
            body={"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                  "spec": {"expirationSeconds": 3600}})["status"]["token"]
        roomy = _node(api_client, f"roomy-{cluster.tag}", gpus=8,
                      labels={**cluster.label, "fit": "roomy"})
        cramped = _node(api_client, f"cramped-{cluster.tag}", gpus=2, cpu="1",
                        labels={**cluster.label, "fit": "cramped"})
        nodes += [roomy, cramped]
        fit = cluster.gpu_class("fit", nodeSelector={**cluster.label, "fit": "roomy"})
        tight = cluster.gpu_class("tight", nodeSelector={**cluster.label, "fit": "cramped"})
        cluster.template("pair", fit, 2)

        # A reservation for a pod that is gone, as one is left when the pod
        # is deleted while no controller runs.
        cluster.claim("shared", fit, 1)
        stale = cluster.get_claim("shared")
        assert stale is not None
        stale["status"] = {"phase": "Bound", "nodeName": roomy,
                           "reservedFor": [{"name": "ghost", "uid": str(uuid.uuid4())}]}
        kube.request(api_client, "PUT", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/"
                     "gpuclaims/shared/status", body=stale)

        # A budget with room: placements are checked against it and its
        # status is kept (the controller reads and writes GPUBudgets).
        kube.request(api_client, "POST", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/"
                     f"{api.BUDGET_PLURAL}", body={
                         "apiVersion": f"{api.GROUP}/{api.VERSION}", "kind": "GPUBudget",
                         "metadata": {"name": "room", "namespace": ns},
                         "spec": {"limits": [{"className": "*", "gpus": 64}]}})

        running = ControllerProcess("sa", str(kubeconfig), workdir,
                                    lease_namespace=SYSTEM_NAMESPACE, lease_name=LEASE_NAME,
                                    flags=("--webhook-bind-address", f"127.0.0.1:{webhook_port}",
                                           "--webhook-host", "127.0.0.1",
                                           "--webhook-cert-dir", str(workdir / "certs")),
                                    # Every scrape below (leading(), samples()) is HTTPS
                                    # with this token, checked by the API server.
                                    metrics_token=scrape_token)
        proc = running.start()
        wait_for(lambda: running.leading() and running.ready(), timeout=60,
                 message=lambda: f"the controller to lead and be ready:\n{running.log_tail()}")

        cluster.pod("train", [{"name": "gpus", "template": "pair"},
                              {"name": "extra", "className": fit, "count": 1}])
        # Its class has only the 2-GPU node, which has too little CPU for it.
        # Something owns it (as a ReplicaSet would; a ConfigMap here, so no
        # controller makes another): only such a pod is deleted when refused.
        owner = cluster.core.create_namespaced_config_map(ns, {"metadata": {"name": "owner"}})
        manifest = cluster.pod_manifest("refused", [{"name": "g", "className": tight, "count": 2}], cpu="2")
        manifest["metadata"]["ownerReferences"] = [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid,
            "controller": True}]
        cluster.core.create_namespaced_pod(ns, manifest)

        wait_for(lambda: cluster.running_on("train", roomy), timeout=60,
                 message=lambda: f"train Running on {roomy}; controller log:\n{running.log_tail()}")
        placed = {n: cluster.get_claim(n) or {} for n in ("train-gpus", "train-extra")}
        wait_for(lambda: not (cluster.get_claim("shared") or {}).get("status", {}).get("reservedFor"),
                 timeout=30, message="the stale reservation to be removed")
        stale_after = cluster.get_claim("shared") or {}
        wait_for(lambda: cluster.read_pod("refused") is None, timeout=60,
                 message="the pod the scheduler refused to be deleted")

        cluster.core.patch_namespaced_pod_status("train", ns, {"status": {"phase": "Succeeded"}})
        wait_for(lambda: all(cluster.get_claim(n) is None for n in placed), timeout=30,
                 message="the finished pod's template claims to be deleted")
        # Events are sent in the background by the recorder: wait for them.
        wait_for(lambda: len(cluster.events("Placed")) >= 2 and cluster.events("NodeRejected"),
                 timeout=30, message="the Placed and NodeRejected events")
        events = {r: cluster.events(r) for r in ("Placed", "NodeRejected")}

        # Preemption: a notebook of priority 0 fills the roomy node; a set of
        # priority 1000 evicts it and runs there. The notebook's finalizer
        # stands for a kubelet's grace period (kwok deletes an evicted pod at
        # once: tests/test_e2e_preemption.py), so the status patch finds it.
        kube.request(api_client, "POST", PRIORITY, body={
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": urgent},
            "value": 1000})
        manifest = cluster.pod_manifest("notebook", [{"name": "g", "className": fit, "count": 8}])
        manifest["metadata"]["finalizers"] = [GRACE_FINALIZER]
        cluster.core.create_namespaced_pod(ns, manifest)
        wait_for(lambda: cluster.running_on("notebook", roomy), timeout=60,
                 message=lambda: f"notebook Running on {roomy}: {cluster.describe_pod('notebook')}")
        manifest = cluster.pod_manifest("urgent", [{"name": "g", "className": fit, "count": 8}])
        manifest["spec"]["priorityClassName"] = urgent
        cluster.core.create_namespaced_pod(ns, manifest)

        def marked() -> dict[str, Any] | None:
            p = cluster.read_pod("notebook")
            for c in (p.status.conditions or ()) if p is not None else ():
                if c.type == DISRUPTION_TARGET and c.reason == PREEMPTED_BY_US:
                    return {"reason": c.reason, "message": c.message, "deleting": bool(p.metadata.deletion_timestamp)}
            return None

        preempted = wait_for(marked, timeout=30, message=lambda: "notebook evicted and marked DisruptionTarget: "
                             f"{cluster.describe_pod('notebook')}\n{running.log_tail()}")
        lift_grace(cluster, ["notebook"])
        wait_for(lambda: cluster.running_on("urgent", roomy), timeout=60,
                 message=lambda: f"urgent Running on {roomy}: {cluster.describe_pod('urgent')}")

        def renewed() -> bool:
            lease = kube.request_json(api_client, "GET", "/apis/coordination.k8s.io/v1/"
                                      f"namespaces/{SYSTEM_NAMESPACE}/leases/{LEASE_NAME}")
            return bool(lease["spec"]["renewTime"] != lease["spec"]["acquireTime"])

        wait_for(renewed, timeout=10, message="the controller to renew its Lease")
        admissions = sum(v for name, _labels, v in running.samples()
                         if name == "gpuclaimctl_admission_requests_total")
        running.signal(signal.SIGTERM)
        code = running.wait(30)
        yield Stories(
            node=roomy, placed_claims=placed, events=events, stale_claim=stale_after,
            lease_holder_after_exit=lease_holder(api_client, SYSTEM_NAMESPACE, LEASE_NAME),
            exit_code=code, audit=full_plane.audit_events(SERVICE_ACCOUNT), admissions=admissions,
            kubeconfig=kubeconfig, preempted=preempted)
    finally:
        kubectl(full_plane, "delete", "--ignore-not-found", "-f", "-",
                stdin=yaml.safe_dump_all([mutating, validating]))
        if proc is not None:
            proc.stop()
        lift_grace(cluster)
        try:
            kube.request(api_client, "DELETE", f"{PRIORITY}/{urgent}")
        except kube.ApiError:
            pass
        cluster.cleanup()
        for n in nodes:
            core.delete_node(n)
        core.delete_namespace(ns, propagation_policy="Background")
        if reader_docs:
            kubectl(full_plane, "delete", "--ignore-not-found", "-f", "-",
                    stdin=yaml.safe_dump_all(reader_docs))
        _delete_rbac(full_plane, api_client)


def test_controller_does_its_whole_job_with_only_its_service_accounts_rights(
    stories: Stories,
) -> None:
    for name, claim in stories.placed_claims.items():
        status = claim.get("status") or {}
        assert status.get("phase") == "Bound" and status.get("nodeName") == stories.node, name
        assert status["reservedFor"][0]["name"] == "train"
    # The refused pod was placed too, before the scheduler refused it.
    assert sorted(e.involved_object.name for e in stories.events["Placed"]) == ["refused", "train"]
    assert [e.involved_object.name for e in stories.events["NodeRejected"]] == ["refused"]
    assert stories.stale_claim["status"]["phase"] == "Pending"
    # It preempted the notebook for the set of higher priority, which ran in its place.
    assert stories.preempted["deleting"], stories.preempted
    assert "higher priority pod" in stories.preempted["message"] and "/urgent (priority 1000)" in \
        stories.preempted["message"], stories.preempted
    assert {("list", "policy", "poddisruptionbudgets", ""), ("create", "", "pods", "eviction"),
            ("patch", "", "pods", "status")} <= used(stories.audit)
    # It led on deploy/'s Lease, renewed it, and handed it back on SIGTERM.
    assert stories.exit_code == 0
    assert stories.lease_holder_after_exit == ""
    lease_requests = {e["verb"] for e in stories.audit
                    if (e.get("objectRef") or {}).get("resource") == "leases"
                    and e["objectRef"].get("name") == LEASE_NAME}
    assert {"create", "get", "update"} <= lease_requests
    # Every replica serves the webhook; this one answered the stories' pods,
    # with the certificate it wrote into deploy/'s Secret.
    assert stories.admissions >= 2
    secret_writes = {e["verb"] for e in stories.audit
                     if (e.get("objectRef") or {}).get("resource") == "secrets"}
    assert secret_writes == {"get", "update"}
    # Its /metrics were read with the scraper's token, which it had the API
    # server authenticate and authorize.
    reviews = {(e["objectRef"]["resource"], e["verb"]) for e in stories.audit
               if (e.get("objectRef") or {}).get("resource") in ("tokenreviews",
                                                                 "subjectaccessreviews")}
    assert reviews == {("tokenreviews", "create"), ("subjectaccessreviews", "create")}


def test_the_api_server_refused_the_controller_nothing(stories: Stories) -> None:
    # A 403 from admission because an earlier test's namespace is being
    # deleted (an event about a pod there) is not the RBAC refusing anything.
    forbidden = [(e["verb"], e["requestURI"]) for e in stories.audit
                 if (e.get("annotations") or {}).get("authorization.k8s.io/decision") == "forbid"
                 or ((e.get("responseStatus") or {}).get("code") == 403
                     and "being terminated" not in (e.get("responseStatus") or {}).get("message", ""))]
    assert stories.audit, "no request of the service account was audited"
    assert forbidden == []


def test_the_live_read_of_a_claim_is_granted(stories: Stories) -> None:
    """A claim is read live only to settle a bind whose answer was lost and
    by the in-flight audit, neither of which the stories bring about: the
    read itself, as the service account (a 403 raises; 404 is None)."""
    from gpuclaimctl.client.writer import Writer

    assert stories.kubeconfig is not None
    sa = config.new_client_from_config(str(stories.kubeconfig))
    with sa:
        claim = next(iter(stories.placed_claims.values()))
        meta = claim["metadata"]
        live = Writer(sa).get_claim(meta["namespace"], meta["name"])
        assert live is None or live["metadata"]["uid"] == meta["uid"]


def test_roles_grant_no_verb_or_resource_the_controller_did_not_use(stories: Stories) -> None:
    grants = granted(rbac_docs())
    uses = used(stories.audit)
    unused = sorted(grants - uses - set(UNEXERCISED) - SOMETIMES_USED)
    assert unused == [], (
        "deploy/ grants (verb, group, resource, subresource) the controller never used; "
        f"remove them or add them to UNEXERCISED with the reason: {unused}")
    # An allowance the controller has started to use is no longer an exception.
    assert not set(UNEXERCISED) & uses
    assert set(UNEXERCISED) <= grants


# -- an experiment for UNEXERCISED ------------------------------------------------------


def test_pods_finalizers_grant_is_what_lets_the_controller_create_owned_claims_under_strict_owner_references(
    tmp_path: Path,
) -> None:
    """With OwnerReferencesPermissionEnforcement, the claim the controller
    creates for a pod's entry is refused unless the service account may
    update pods/finalizers; with deploy/'s ClusterRole it is created."""
    with ControlPlane(tmp_path / "plane", admission_plugins=[OWNER_REFERENCES_PLUGIN]) as strict:
        admin = config.new_client_from_config(config_file=str(strict.kubeconfig))
        utils.create_from_yaml(admin, str(DEPLOY / "crds" / f"{api.CLAIM_PLURAL}.yaml"))
        docs = rbac_docs()
        without = copy.deepcopy(docs)
        for doc in without:
            if doc["kind"] == "ClusterRole":
                doc["rules"] = [r for r in doc["rules"] if "pods/finalizers" not in r["resources"]]
        apply(strict, without)
        sa = config.new_client_from_config(config_file=str(
            service_account_kubeconfig(strict, admin, tmp_path / "sa.kubeconfig")))

        core = client.CoreV1Api(admin)
        namespace_with_default_account(admin, "team")
        manifest: Any = {"metadata": {"name": "trainer"},
                         "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
        pod: dict[str, Any] = admin.sanitize_for_serialization(
            core.create_namespaced_pod("team", manifest))
        claims = f"/apis/{api.GROUP}/{api.VERSION}/namespaces/team/{api.CLAIM_PLURAL}"
        body = template_claim(pod, ClaimEntry(name="g", class_name="a100", count=1))

        def create() -> int:
            """201 or 403; 0 while the new CRD's storage still initializes (429)."""
            try:
                kube.request(sa, "POST", claims, body=body)
                return 201
            except kube.ApiError as e:
                if e.status == 429:
                    return 0
                assert e.status == 403, e
                assert "blockOwnerDeletion" in e.message, e.message
                return 403

        wait_for(lambda: _allowed(sa, claims), timeout=30,
                 message="the service account's ClusterRole to take effect")
        assert wait_for(create, timeout=30, message="an answer other than 429") == 403
        apply(strict, docs)
        wait_for(lambda: create() == 201, timeout=30,
                 message="the claim created once pods/finalizers is granted")
