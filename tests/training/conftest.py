"""The execution stack, the proxy process and the CLI fixtures, shared for training tests."""

from tests.cli.conftest import cli_env, synth  # noqa: F401 - fixtures
from tests.harness.conftest import proxy_socket, tokenizer_dir  # noqa: F401 - fixtures
from tests.trials.conftest import stack  # noqa: F401 - fixture
