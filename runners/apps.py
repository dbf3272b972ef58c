from django.apps import AppConfig


class RunnersConfig(AppConfig):
    name = "runners"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from campaigns import dispatch as campaigns_dispatch
        from inventory import dispatch as inventory_dispatch
        from runners import dispatch

        campaigns_dispatch.runner.connect(dispatch.CeleryRunner())
        inventory_dispatch.collect_facts.connect(dispatch.collect_facts)
        inventory_dispatch.refresh_facts.connect(dispatch.refresh_facts)
