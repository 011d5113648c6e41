"""`coopsched judge`: the per-token SLO applied to token timings another tool recorded (aiperf, locust, a trace)."""
