"""Gunicorn configuration that starts the agent in the master: ``gunicorn -c examples/gunicorn_conf.py``.

    gunicorn -c examples/gunicorn_conf.py -w 4 -b 127.0.0.1:8000 examples.app:app

Gunicorn executes this file in the master before it loads the application or forks a
worker, which is exactly where swmp wants to start: the arena is created and the reporter
forked once, and every worker (with or without ``--preload``, after ``max_requests``
recycling or a HUP reload) takes its ring slot at fork.
"""

import swmp

swmp.start()  # settings from SW_* variables; keywords override them

# Gunicorn 27 otherwise opens a control socket under ~/.gunicorn.
control_socket_disable = True
