"""The real-plane stories `make test-versions` runs on each older supported
Kubernetes (docs/versions.md): the ones whose outcome rests on what the API
server, kube-scheduler or kube-controller-manager of that minor do.

`pytest --version-stories` keeps exactly these (a file alone keeps all of
its tests) and fails when an entry matches no test, so a renamed story
cannot silently drop out of the older versions' runs. `make test` runs
them, with everything else, on the newest.
"""

from __future__ import annotations

from collections.abc import Iterable

STORIES = (
    # The version check at start, against the session's real server.
    "tests/test_serverversion.py::test_the_real_server_is_read_and_judged_supported",
    "tests/test_serverversion.py::test_the_real_process_says_which_kubernetes_it_met_and_what_it_chose",
    # A kept plane (make run) goes up one minor, never back, never skips one.
    "tests/test_controlplane_versions.py::test_a_kept_plane_goes_up_one_minor_and_never_back",
    # Scheduling gates (PodSchedulingReadiness): a gated pod waits, takes the
    # node affinity it is pinned with, and is bound there once released;
    # what may change while gated; garbage collection; a watch's 410.
    "tests/test_controlplane.py::test_gated_pod_is_bound_to_the_pinned_node_once_released",
    "tests/test_controlplane.py::test_adding_a_node_selector_term_to_a_gated_pod_is_refused",
    "tests/test_controlplane.py::test_deleting_an_owner_garbage_collects_its_dependent",
    "tests/test_controlplane.py::test_a_watch_from_before_an_etcd_compaction_ends_with_410_gone",
    # Placement and release: kube-scheduler binds the released pod where it
    # was pinned, or refuses a node; a lost node's claim.
    "tests/test_e2e.py::test_two_inline_claims_are_placed_together_on_the_one_node_with_room_for_both",
    "tests/test_e2e.py::test_a_class_status_shows_its_nodes_gpus_and_what_is_bound",
    "tests/test_e2e.py::test_a_node_the_scheduler_refuses_is_rejected_and_the_recreated_pod_lands_elsewhere",
    "tests/test_e2e.py::test_a_claim_whose_node_vanished_is_lost_and_placed_again_for_its_next_pod",
    # Template claims: made per pod, collected with it by the garbage
    # collector (ownerReferences), refused by the API server.
    "tests/test_e2e.py::test_template_claim_lives_with_its_pod_and_a_recreated_pod_gets_a_fresh_one",
    "tests/test_e2e.py::test_a_template_the_api_server_refuses_to_make_a_claim_from_is_reported_on_the_pod",
    # Gangs: no minor before 1.37 serves the PodGroups the controller reads,
    # so there a gang is declared by annotations; an Indexed Job's (the Job
    # controller of this minor makes the members) is released whole.
    "tests/test_e2e_gangs.py::test_an_indexed_job_of_four_is_released_whole_onto_four_nodes",
    # Budgets, and the CRDs' CEL rules on this API server.
    "tests/test_e2e_budgets.py::test_a_namespace_at_its_limit_waits_with_budget_while_another_namespace_takes_the_free_node",
    "tests/test_e2e_budgets.py::test_raising_the_budget_releases_the_waiting_pod",
    "tests/test_e2e_budgets.py::test_the_crd_refuses_a_malformed_limit_with_a_clear_message",
    # The claims' status subresource (status.nodeName, status.resourceName
    # and the rule that a Bound claim names its node), and spec immutability.
    "tests/test_crds.py::test_full_status_is_accepted_as_written",
    "tests/test_crds.py::test_invalid_claim_status_is_refused",
    "tests/test_crds.py::test_status_update_cannot_change_spec",
    "tests/test_crds.py::test_claim_spec_cannot_change_after_creation",
    # The webhook: matchConditions compiled by this API server, gate
    # injection, refusals, the default class, failurePolicy with it down.
    "tests/test_webhook_deploy.py::test_the_api_server_accepts_the_configurations_and_compiles_their_cel",
    "tests/test_webhook_plane.py::test_a_pod_with_claims_and_no_gate_is_gated_and_then_placed",
    "tests/test_webhook_plane.py::test_a_bad_annotation_is_refused_at_create_with_the_controllers_message",
    "tests/test_webhook_plane.py::test_an_unchanged_job_in_a_labelled_namespace_gets_claims_and_runs",
    "tests/test_webhook_plane.py::test_a_pod_without_gpus_in_a_labelled_namespace_is_untouched",
    "tests/test_webhook_plane.py::test_a_user_removing_the_gate_is_refused",
    "tests/test_webhook_plane.py::test_a_gpu_pod_without_claims_is_refused_where_a_budget_applies",
    "tests/test_webhook_plane.py::test_with_the_webhook_down_pods_with_claims_are_refused_and_others_unaffected",
    # deploy/'s roles against this API server's authorizer.
    "tests/test_controller_identity.py::test_the_tests_controller_runs_as_its_own_service_account_with_deploys_roles_alone",
    # Leader election on this server's Leases, and failover, with the real process.
    "tests/test_failover.py::test_only_the_leader_places_pods_and_both_serve_their_probes",
    "tests/test_failover.py::test_standby_takes_over_a_killed_leader_within_lease_duration_plus_retry_period",
    "tests/test_failover.py::test_sigterm_leader_exits_zero_releases_the_lease_and_the_standby_leads_within_3s",
    # The informers: initial sync by WatchList (and the list fallback), the
    # 410 relist after an etcd compaction, bookmarks, an API server restart.
    "tests/test_watchlist.py::test_watch_list_gives_the_cache_a_list_gives_and_goes_on_watching",
    "tests/test_watchlist.py::test_a_server_without_watch_list_is_listed_instead",
    "tests/test_watchlist.py::test_a_410_relists_by_watch_list_and_the_cache_equals_a_fresh_list",
    "tests/test_shared_informer.py::test_a_410_forced_by_an_etcd_compaction_relists_and_the_cache_equals_a_fresh_list",
    "tests/test_shared_informer.py::test_an_api_server_restart_with_changes_made_while_it_was_away_leaves_the_cache_equal_to_a_fresh_list",
    "tests/test_reflector.py::test_bookmarks_advance_the_resource_version_of_a_quiet_watch",
    "tests/test_reflector.py::test_an_etcd_compaction_in_the_middle_of_a_paginated_list_falls_back_to_a_full_list",
)


def matches(entry: str, nodeid: str) -> bool:
    """Whether a story entry names this test (a file: each of its tests;
    a test: each of its parametrized cases)."""
    return nodeid == entry or nodeid.startswith((entry + "::", entry + "["))


def select(nodeids: Iterable[str], stories: Iterable[str] = STORIES) -> tuple[list[str], list[str]]:
    """The node ids to run, and the entries that matched none of them."""
    ids = list(nodeids)
    entries = list(stories)
    keep = [n for n in ids if any(matches(e, n) for e in entries)]
    unmatched = [e for e in entries if not any(matches(e, n) for n in ids)]
    return keep, unmatched
