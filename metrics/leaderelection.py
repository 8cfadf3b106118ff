"""Leader-election metrics, named as client-go names them.

``leader_election_master_status{name}`` is 1 while this process holds the
named lease and 0 otherwise, so a dashboard can sum it over replicas and
alert when the sum is not exactly 1.

Nothing is registered at import: a ``LeaderElectionMetrics`` registers its
gauge with the registry it is given, so tests use a fresh
``CollectorRegistry`` each and production passes its own. This module
imports nothing of ours.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge


class LeaderElectionMetrics:
    """The ``leader_election_master_status`` gauge in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._master_status = Gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, "
            "0 indicates backup, 1 indicates master. 'name' is the string used "
            "to identify the lease.",
            ["name"],
            registry=registry,
        )

    def leader_on(self, name: str) -> None:
        self._master_status.labels(name=name).set(1)

    def leader_off(self, name: str) -> None:
        self._master_status.labels(name=name).set(0)
