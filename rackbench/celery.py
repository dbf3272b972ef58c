import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "rackbench.settings")

app = Celery("rackbench")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
