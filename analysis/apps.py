from django.apps import AppConfig


class AnalysisConfig(AppConfig):
    default_auto_field = "django.db.models.BigAutoField"
    name = "analysis"

    def ready(self) -> None:
        from analysis import tasks
        from campaigns import dispatch

        dispatch.suite_step_ended.connect(tasks.suite_run_ended_later)
