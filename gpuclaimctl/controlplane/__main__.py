"""`python -m gpuclaimctl.controlplane build`: build the binaries if missing."""

from __future__ import annotations

import sys

from gpuclaimctl.controlplane.build import BuildError, ensure_binaries


def main(argv: list[str]) -> int:
    if argv[1:] not in ([], ["build"]):
        print("usage: python -m gpuclaimctl.controlplane [build]", file=sys.stderr)
        return 2
    try:
        paths = ensure_binaries(log=lambda m: print(m, file=sys.stderr))
    except BuildError as e:
        print(f"gpuclaimctl: {e}", file=sys.stderr)
        return 1
    for name, path in sorted(paths.items()):
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
