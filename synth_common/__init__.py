"""Helpers every runtime shares (the control plane, the trial host, the sandbox, the launcher, the
proxy), with no dependency on Django: canonical JSON and digests, log-line folding."""
