"""``swmp demo``: collector + two example services + load, then trace trees (docs/quickstart.md)."""
