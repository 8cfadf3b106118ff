"""`python -m gpuclaimctl` is the gpuclaimctl command."""

from gpuclaimctl.cmd.cli import main

main()
