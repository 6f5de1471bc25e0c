import logging
import os

from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "apps.runs"
    label = "runs"

    def ready(self) -> None:
        # Harbor pins its logger to DEBUG when imported (cheap: it does not import Harbor's
        # heavy parts); import it now and apply our level, so trial logs stay readable.
        import harbor.utils.logger  # noqa: F401

        level = os.environ.get("SYNTH_HARBOR_LOG_LEVEL", "INFO")
        logging.getLogger("harbor.utils.logger").setLevel(level)
