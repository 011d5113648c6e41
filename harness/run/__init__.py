"""Scenarios in one run: load, execute, trace JSON, bounds, latency metrics, the SLO, `coopsched run`."""
