"""Django settings of the web test apps: each app module is its own URLconf."""

from __future__ import annotations

import django
from django.conf import settings


def configure(urlconf: str) -> None:
    if settings.configured:
        return
    settings.configure(
        ROOT_URLCONF=urlconf,
        ALLOWED_HOSTS=["*"],
        DEBUG=False,
        SECRET_KEY="swmp-test",
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        LOGGING_CONFIG=None,
    )
    django.setup()
