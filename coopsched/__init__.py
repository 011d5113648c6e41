"""coopsched: a reference test harness for speculative-decoding schedulers.

The system under test lives in `coopsched.core` (pure, clock-injected); the
engine, backends, server and CLI wrap it. See README.md and docs/architecture.md.
"""

__version__ = "0.1.0"
