"""The deterministic simulation: an in-memory API server the real sync code
runs against, driven one step at a time by a seeded harness."""
