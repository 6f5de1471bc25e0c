"""The `synth` command-line client: speaks only the REST API (see synth_cli/README.md)."""

__version__ = "0.1.0"
