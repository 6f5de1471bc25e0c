import logging

from django.apps import AppConfig
from django.conf import settings


class TrialsConfig(AppConfig):
    """The trial host: the pipeline that runs one attempt (claim, admit, model access, Harbor,
    publish, complete), resource admission, judges and work directories. No models of its own:
    it writes the control plane's records (apps.runs) through their services."""

    name = "apps.trials"
    label = "trials"

    def ready(self) -> None:
        # Harbor pins its logger to DEBUG when imported (cheap: it does not import Harbor's
        # heavy parts); import it now and apply our level, so trial logs stay readable.
        import harbor.utils.logger  # noqa: F401

        logging.getLogger("harbor.utils.logger").setLevel(settings.SYNTH_HARBOR_LOG_LEVEL)
