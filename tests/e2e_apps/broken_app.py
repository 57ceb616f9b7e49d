"""An application that cannot be imported: its Gunicorn worker fails to boot (exit code 3)
and the master shuts down, for the master-logs test in tests/test_logs_gunicorn.py."""

from __future__ import annotations

raise RuntimeError("broken_app: configuration missing (on purpose)")
