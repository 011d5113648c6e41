"""`coopsched sweep`: a scenario's workload at several loads x modes x seeds, judged by a per-token SLO."""
