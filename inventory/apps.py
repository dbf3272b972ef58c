from django.apps import AppConfig


class InventoryConfig(AppConfig):
    name = "inventory"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from inventory import selectors
        from plugins.benchmarks import command

        # The command step's port: its allow-list is the admins' AllowedCommand rows.
        command.set_allow_list(selectors.allowed_command, selectors.allowed_command_names)
