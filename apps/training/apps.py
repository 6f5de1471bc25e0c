from django.apps import AppConfig


class TrainingConfig(AppConfig):
    name = "apps.training"
    label = "training"

    def ready(self) -> None:
        from apps.training import receivers  # noqa: F401 - connects the signal receivers
