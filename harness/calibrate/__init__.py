"""`coopsched calibrate`: a mock cost profile (a digital twin) from the MLX backend or any server."""
