"""Admission for pods (issue 14, DESIGN.md §4b): what the webhook decides.

`review` reads an AdmissionReview v1 and writes its answer (allowed,
refused with a status, or a JSON patch); `pods` decides the mutation and
the validation of one pod request from plain values; `configurations`
renders the webhook configurations the API server is given, so deploy/
and the tests register the same scoping.

Pure: no client, no clock, no globals; the process serving HTTPS and
keeping the certificates lives in gpuclaimctl.cmd and gpuclaimctl.client.
"""
