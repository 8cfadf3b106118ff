"""gpuclaimctl: places each pod's whole set of GPU claims on one node."""

__version__ = "0.1.0"
