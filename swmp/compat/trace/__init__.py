"""``skywalking.trace`` of the SkyWalking Python agent: see :mod:`swmp.compat`."""
