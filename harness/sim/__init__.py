"""Seeded deterministic simulation with faults and per-tick invariants (`coopsched simulate`)."""
