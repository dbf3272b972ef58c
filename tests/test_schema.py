"""The OpenAPI schema says what the API answers: nullable teams, the instantiate answer, every error status in the
one error shape; and bad pagination parameters are refused, not ignored."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from rest_framework.test import APIClient


@pytest.fixture
def schema(db: Any, owner: Any) -> dict[str, Any]:
    client = APIClient()
    client.force_login(owner)
    return yaml.safe_load(client.get("/api/v1/schema/").content)


def test_team_and_other_optional_references_are_nullable(schema: dict[str, Any]) -> None:
    components = schema["components"]["schemas"]
    for component, field in [("Node", "team"), ("Credential", "team"), ("StorageSystem", "team"), ("Campaign", "team"),
                             ("Campaign", "storage"), ("Campaign", "owner"), ("Baseline", "team"),
                             ("Baseline", "created_by")]:  # fmt: skip
        assert components[component]["properties"][field].get("nullable") is True, (component, field)


def test_instantiating_a_preset_is_documented_as_the_list_of_campaigns_it_made(schema: dict[str, Any]) -> None:
    answer = schema["paths"]["/api/v1/presets/{slug}/instantiate/"]["post"]["responses"]["201"]
    ref = answer["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    campaigns = schema["components"]["schemas"][ref]["properties"]["campaigns"]
    assert campaigns["type"] == "array" and campaigns["items"]["$ref"].endswith("/Campaign")


def test_every_operation_documents_its_errors_in_the_one_error_shape(schema: dict[str, Any]) -> None:
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["message", "extra"]
    operations = 0
    for path, methods in schema["paths"].items():
        for method, operation in methods.items():
            operations += 1
            codes = {"400", "401", "403", "429"} | ({"404"} if "{" in path else set())
            codes |= {"409"} if method in ("post", "put", "patch", "delete") else set()
            for code in codes:
                body = operation["responses"][code]["content"]["application/json"]["schema"]
                assert body == {"$ref": "#/components/schemas/Error"}, (path, method, code)
    assert operations > 40


@pytest.mark.django_db
@pytest.mark.parametrize(
    "query",
    ["limit=abc", "limit=0", "limit=-1", "limit=1001", "offset=-1", "offset=x", "limit=1e3", "offset=99999999999"],
)
def test_bad_limit_or_offset_is_a_400_naming_it(query: str, owner: Any) -> None:
    client = APIClient()
    client.force_login(owner)
    for url in ("/api/v1/nodes/", "/api/v1/campaigns/", "/api/v1/results/"):
        if url.endswith("results/") and query.startswith("offset"):
            continue  # results page by cursor: no offset
        response = client.get(f"{url}?{query}")
        assert response.status_code == 400, (url, query)
        assert query.split("=")[0] in response.json()["extra"], (url, query)
    assert client.get("/api/v1/nodes/?limit=5&offset=10").status_code == 200
    unreadable = client.get("/api/v1/results/?cursor=%2C.%2F%3B")
    assert unreadable.status_code == 400 and "cursor" in unreadable.json()["extra"]
