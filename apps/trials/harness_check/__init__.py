"""Harness conformance: ``manage.py harness_check ENGINE`` (service), the build it checks
(identity), the proxy process that records request shapes (proxy_process) and what the check
concludes (analysis)."""
