"""`python -m gpuclaimctl.controlplane build [--k8s-version 1.35]`: build the
binaries if missing.

Without a version (and without $GPUCLAIMCTL_K8S_VERSION) it builds the newest
supported plane and helm, what `make test` needs; with an older supported
minor, only what that minor's plane needs (its server binaries, and the
shared etcd, kubectl and kwok when missing).
"""

from __future__ import annotations

import sys

from gpuclaimctl.controlplane.build import (
    COMPONENTS,
    NEWEST_MINOR,
    BuildError,
    ensure_binaries,
    plane_components,
    selected_minor,
)

USAGE = "usage: python -m gpuclaimctl.controlplane [build] [--k8s-version MINOR]"


def main(argv: list[str]) -> int:
    args = argv[1:]
    if args[:1] == ["build"]:
        args = args[1:]
    version: str | None = None
    if len(args) == 2 and args[0] == "--k8s-version":
        version = args[1]
    elif len(args) == 1 and args[0].startswith("--k8s-version="):
        version = args[0].partition("=")[2]
    elif args:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        minor = selected_minor(version)
        components = COMPONENTS if minor == NEWEST_MINOR else plane_components(minor)
        paths = ensure_binaries(log=lambda m: print(m, file=sys.stderr), components=components)
    except BuildError as e:
        print(f"gpuclaimctl: {e}", file=sys.stderr)
        return 1
    for name, path in sorted(paths.items()):
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
