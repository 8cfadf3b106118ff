"""gpuclaimctl."""
