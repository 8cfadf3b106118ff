"""Admission webhook metrics, named after controller-runtime's webhook metrics.

``gpuclaimctl_admission_requests_total{webhook, result}`` counts the reviews
this replica answered (result ``allowed``, ``patched`` or ``denied``);
``gpuclaimctl_admission_errors_total{webhook, code}`` the requests it could
not answer with a review (400 malformed, 503 not ready, 500 failed), which
the API server then settles by the webhook's failurePolicy.

Nothing is registered at import. This module imports nothing of ours.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter


class AdmissionMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self._requests = Counter(
            "gpuclaimctl_admission_requests_total",
            "Admission reviews answered, by webhook path and result (allowed, patched, denied).",
            ["webhook", "result"], registry=registry)
        self._errors = Counter(
            "gpuclaimctl_admission_errors_total",
            "Admission requests answered without a review, by webhook path and HTTP code.",
            ["webhook", "code"], registry=registry)

    def answered(self, webhook: str, result: str) -> None:
        self._requests.labels(webhook=webhook, result=result).inc()

    def failed(self, webhook: str, code: int) -> None:
        self._errors.labels(webhook=webhook, code=str(code)).inc()
