"""Gunicorn settings of the gateway (the control API, the admin, run event streams).

    gunicorn synth_project.wsgi -c deploy/gunicorn.conf.py

Threads, not processes, carry the concurrency: event streams (SSE, long-poll) hold a thread
each while they wait, and the work per request is a few database round trips. Values come
from the environment so that one image serves every size.
"""

import os

bind = os.environ.get("SYNTH_BIND", "0.0.0.0:8000")
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "gthread"
threads = int(os.environ.get("SYNTH_GATEWAY_THREADS", "16"))
# Event streams stay open for minutes (the API bounds them itself, `timeout=`): no worker timeout.
timeout = 0
graceful_timeout = 30
keepalive = 75  # above common load balancers' idle timeouts (60 s), so they close first
accesslog = "-"
forwarded_allow_ips = os.environ.get("SYNTH_FORWARDED_ALLOW_IPS", "127.0.0.1")
