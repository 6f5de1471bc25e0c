from django.apps import AppConfig


class ObjectsConfig(AppConfig):
    name = "apps.objects"
    label = "objects"
