"""Against live servers over HTTP: --target runs, the soak."""
