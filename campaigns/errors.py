"""The campaigns app's own error."""

from __future__ import annotations

from common.errors import ApplicationError


class CampaignError(ApplicationError, ValueError):
    """An action that cannot be done; ``conflict`` marks an invalid state transition (HTTP 409)."""
