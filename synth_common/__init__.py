"""Django-free building blocks shared by the server, the launcher, the sandbox and the CLI:
canonical JSON (canonical.py), JSON Schema validators whose "integer" is a JSON integer
(strict_schema.py) and log folding (logfold.py). Nothing here imports Django or apps.*, so
the packages that must run without the server (synth_launcher, synth_sandbox, synth_cli)
can use them."""
