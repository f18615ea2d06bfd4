import os

from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "testproject.shop"
    label = "shop"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get("TESTPROJECT_FREEZE_AFTER_PUBLISH"):
            from testproject.shop import faults

            faults.install_freeze_after_publish(os.environ["TESTPROJECT_FREEZE_AFTER_PUBLISH"])
        if os.environ.get("TESTPROJECT_FREEZE_AFTER_STORE"):
            from testproject.shop import faults

            faults.install_freeze_after_store(os.environ["TESTPROJECT_FREEZE_AFTER_STORE"])
        if os.environ.get("TESTPROJECT_PAUSE_AFTER_PUBLISH"):
            from testproject.shop import faults

            marker, seconds = os.environ["TESTPROJECT_PAUSE_AFTER_PUBLISH"].rsplit(":", 1)
            faults.install_pause_after_publish(marker, float(seconds))
