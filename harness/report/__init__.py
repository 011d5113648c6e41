"""Reports: HTML/PNG plots, benchmark history and trends, the regression gate (`coopsched report`)."""
