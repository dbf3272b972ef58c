"""Teams own campaigns and inventory; API tokens act for one user within one team.

An object whose team is empty is shared by every signed-in user (the built-in lab's nodes, campaigns made from
the command line without a team). An object of a team is invisible to everyone outside it: lookups answer 404.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Team(models.Model):
    name = models.CharField(max_length=100, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, through="Membership", related_name="teams")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    class Role(models.TextChoices):
        """Nothing is reserved to a team's admins yet: every member changes the team's campaigns and inventory
        (inventory.selectors.inventory_can_change says why)."""

        MEMBER = "member"
        ADMIN = "admin"

    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.MEMBER)

    class Meta:
        ordering = ["team", "user"]
        constraints = [models.UniqueConstraint(fields=["team", "user"], name="membership_unique")]

    def __str__(self) -> str:
        return f"{self.user} in {self.team} ({self.role})"


class TokenScope(models.TextChoices):
    READ = "read", "read-only"
    LAUNCH = "launch", "read and launch"


class ApiToken(models.Model):
    """A secret shown once at creation; only its SHA-256 is kept. ``prefix`` finds the row without a scan."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    team = models.ForeignKey(Team, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100, help_text="what the token is for, e.g. the pipeline that uses it")
    scope = models.CharField(max_length=10, choices=TokenScope.choices, default=TokenScope.READ)
    prefix = models.CharField(max_length=16, unique=True, editable=False)
    digest = models.CharField(max_length=64, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="empty: never")
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.scope})"
