"""The OpenAPI schema's error responses: every operation documents the one error shape for the statuses it can
answer with (drf-spectacular postprocessing hook, SPECTACULAR_SETTINGS["POSTPROCESSING_HOOKS"])."""

from __future__ import annotations

from typing import Any

ERROR = {
    "type": "object",
    "description": "Every error: what went wrong, and in extra the offending field(s) or what is in the way.",
    "properties": {
        "message": {"type": "string"},
        "extra": {"type": "object", "additionalProperties": {}},
    },
    "required": ["message", "extra"],
}
WHY = {
    "400": "Invalid input; extra names the field(s)",
    "401": "No valid credentials (a token or a session)",
    "403": "Not allowed: a read-only token acting, or a change reserved to staff or a team's admins",
    "404": "Not found, or another team's",
    "409": "The object's state does not allow it (e.g. launching a running campaign), or it is still in use",
    "415": "The body is not JSON",
    "429": "Too many requests: see Retry-After",
}


def add_error_responses(result: dict[str, Any], generator: Any, request: Any, public: bool) -> dict[str, Any]:
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR
    ref = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "responses" not in operation:
                continue
            codes = ["400", "401", "403", "429"]
            if "{" in path:
                codes.append("404")
            if method in ("post", "put", "patch", "delete"):
                codes.append("409")
            if "requestBody" in operation:
                codes.append("415")
            for code in codes:
                operation["responses"].setdefault(code, {"description": WHY[code], **ref})
    return result
