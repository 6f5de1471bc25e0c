from synth_project.celery import app as celery_app

__all__ = ("celery_app",)
