"""Scenarios in one run: load, execute, trace JSON, checks and bounds, latency metrics, `coopsched run`."""
