"""informers."""
