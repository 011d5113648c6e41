"""`coopsched compare BASE NEW`: two runs or two sweeps side by side, and the rule that says which
metric regressed (rule.py; `coopsched report` and the bench gate judge with it too).
"""
