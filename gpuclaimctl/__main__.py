"""`python -m gpuclaimctl` is the gpuclaimctl command."""

from gpuclaimctl.cli import main

main()
