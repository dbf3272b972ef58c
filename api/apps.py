from django.apps import AppConfig


class ApiConfig(AppConfig):
    name = "api"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from api.serializers import VerdictSerializer
        from campaigns import dispatch

        dispatch.verdict_document.connect(lambda verdict: dict(VerdictSerializer(verdict).data))
