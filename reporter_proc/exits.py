"""The reporter process's exit statuses (what its supervisor decides by).

Never 3 or 4: Gunicorn <= 23 halts the whole server when any child it reaps exits with those.
"""

from __future__ import annotations

from typing import Final

EXIT_OK: Final = 0
EXIT_ERROR: Final = 70  # EX_SOFTWARE: something broke; the supervisor restarts us
EXIT_CONFIG: Final = 78  # EX_CONFIG: restarting cannot help (no such protocol, bad settings)
