"""Bulk import of nodes from CSV or YAML: every row checked first, then all applied in one transaction.

A row names a node; an existing node of that name is updated, otherwise one is created. Only the fields a
row gives are written: an empty CSV cell or an absent YAML key leaves the node's value as it is (or the
default, for a new node). Errors carry the line they come from: for CSV the file line where the record
starts, for YAML the line where the item starts.

CSV: a header line naming the columns; ``tags`` separated by ``;``.
YAML: a list of mappings, or a mapping whose ``nodes`` key holds that list; ``tags`` a list (or a string).
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Literal

import yaml
from django.db import transaction

from common.names import NAME_RE, name_problem
from inventory import services
from inventory.models import Credential, Node, NodeRole, NodeStatus, Site

COLUMNS = (
    "name",
    "address",
    "ssh_port",
    "ssh_user",
    "credential",
    "role",
    "status",
    "site",
    "tags",
    *Node.HARDWARE_FIELDS,
)
REQUIRED = ("name", "address")
TEXT_FIELDS = ("name", "address", "ssh_user", "gpu_model", "cpu_model", "container_runtime")
COUNT_FIELDS = ("gpu_count", "gpu_memory_mb", "cpu_cores", "ram_mb")
MAX_ERRORS = 200
_TAG = re.compile(r"^[-a-zA-Z0-9_]+$")  # what a Tag's SlugField accepts


class NodeImportError(ValueError):
    """The import was refused; ``errors`` holds every (line, message), sorted by line."""

    def __init__(self, errors: list[tuple[int, str]]) -> None:
        self.errors = sorted(errors)
        super().__init__("; ".join(f"line {line}: {message}" for line, message in self.errors))


@dataclass
class _Row:
    line: int
    values: dict[str, Any]
    fields: dict[str, Any] = field(default_factory=dict)
    credential: str = ""
    site: str = ""
    tags: list[str] | None = None


def nodes_import(*, text: str, fmt: Literal["csv", "yaml"]) -> list[Node]:
    """Create or update every node the text describes, or none of them (raising NodeImportError)."""
    if fmt == "csv":
        rows, errors = _csv_rows(text)
    elif fmt == "yaml":
        rows, errors = _yaml_rows(text)
    else:
        raise ValueError(f"unknown import format {fmt!r}: use csv or yaml")
    if not errors and not rows:
        errors.append((1, "no nodes in the file"))
    errors += _check(rows)  # the rows that could be read are checked even when others could not
    if errors:
        raise NodeImportError(errors[:MAX_ERRORS])
    with transaction.atomic():
        return [_apply(row) for row in rows]


# --- reading ----------------------------------------------------------------------------------


def _csv_rows(text: str) -> tuple[list[_Row], list[tuple[int, str]]]:
    reader = csv.reader(io.StringIO(text.lstrip("\ufeff")))
    errors: list[tuple[int, str]] = []
    try:
        records = list(_records(reader))
    except csv.Error as exc:
        return [], [(reader.line_num, f"not valid CSV: {exc}")]
    if not records:
        return [], []
    header_line, header = records[0]
    columns = [cell.strip() for cell in header]
    for position, column in enumerate(columns):
        if column not in COLUMNS:
            errors.append((header_line, f"unknown column {column!r}; the columns are: {', '.join(COLUMNS)}"))
        elif column in columns[:position]:
            errors.append((header_line, f"column {column!r} appears twice"))
    errors += [(header_line, f"column {c!r} is missing: every node needs one") for c in REQUIRED if c not in columns]
    if errors:
        return [], errors
    rows = []
    for line, cells in records[1:]:
        if len(cells) != len(columns):
            errors.append((line, f"{len(cells)} fields where the header has {len(columns)}"))
            continue
        values: dict[str, Any] = {c: cell.strip() for c, cell in zip(columns, cells, strict=True) if cell.strip()}
        if "tags" in values:
            values["tags"] = [tag.strip() for tag in values["tags"].split(";") if tag.strip()]
        rows.append(_Row(line=line, values=values))
    return rows, errors


def _records(reader: Any) -> Iterator[tuple[int, list[str]]]:
    """Non-blank records with the line each starts on (a quoted field may span lines)."""
    start = 1
    for cells in reader:
        if any(cell.strip() for cell in cells):
            yield start, cells
        start = reader.line_num + 1


def _yaml_rows(text: str) -> tuple[list[_Row], list[tuple[int, str]]]:
    try:
        document = yaml.compose(text)  # nodes keep their marks, unlike safe_load's plain objects
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        return [], [((mark.line + 1) if mark else 1, f"not valid YAML: {problem}")]
    if document is None:
        return [], []
    items: Any = document
    if isinstance(document, yaml.MappingNode):
        items = next((v for k, v in document.value if k.value == "nodes"), None)
        if items is None:
            return [], [(document.start_mark.line + 1, "expected a list of nodes, or a mapping with a 'nodes' list")]
    if not isinstance(items, yaml.SequenceNode):
        return [], [(items.start_mark.line + 1, "expected a list of nodes")]
    constructor = yaml.constructor.SafeConstructor()
    rows, errors = [], []
    for item in items.value:
        line = item.start_mark.line + 1
        if not isinstance(item, yaml.MappingNode):
            errors.append((line, "each node must be a mapping of field: value"))
            continue
        values: dict[str, Any] = {}
        for key_node, value_node in item.value:
            key = key_node.value
            if key not in COLUMNS:
                errors.append((line, f"unknown key {key!r}; the keys are: {', '.join(COLUMNS)}"))
            elif key in values:
                errors.append((line, f"key {key!r} appears twice"))
            else:
                values[key] = constructor.construct_object(value_node, deep=True)
        rows.append(_Row(line=line, values={k: v for k, v in values.items() if v not in (None, "")}))
    return rows, errors


# --- checking ---------------------------------------------------------------------------------


def _check(rows: list[_Row]) -> list[tuple[int, str]]:
    """Check every row (collecting every error) and fill in each row's model fields."""
    errors: list[tuple[int, str]] = []
    credentials = set(Credential.objects.values_list("name", flat=True))
    first_line: dict[str, int] = {}
    for row in rows:
        row_errors = _check_row(row, credentials)
        name = row.fields.get("name")
        if name in first_line:
            row_errors.append(f"node {name!r} is already on line {first_line[name]}")
        elif name:
            first_line[name] = row.line
        errors += [(row.line, message) for message in row_errors]
    return errors


def _check_row(row: _Row, credentials: set[str]) -> list[str]:
    errors: list[str] = []
    values = row.values
    errors += [f"{key} is missing" for key in REQUIRED if key not in values]
    for key in TEXT_FIELDS:
        if key in values:
            text, error = _text(key, values[key])
            if error:
                errors.append(error)
            else:
                row.fields[key] = text
    if row.fields.get("name") and not NAME_RE.match(row.fields["name"]):
        errors.append(f"name {row.fields['name']!r}: {name_problem(row.fields['name'])}")
    if "ssh_port" in values:
        port = _count(values["ssh_port"])
        if port is None or not 1 <= port <= 65535:
            errors.append(f"ssh_port {values['ssh_port']!r} is not a TCP port (1-65535)")
        else:
            row.fields["ssh_port"] = port
    for key in COUNT_FIELDS:
        if key in values:
            count = _count(values[key])
            if count is None:
                errors.append(f"{key} {values[key]!r} is not a whole number >= 0")
            else:
                row.fields[key] = count
    for key, choices in (("role", NodeRole.values), ("status", NodeStatus.values)):
        if key in values:
            if values[key] in choices:
                row.fields[key] = values[key]
            else:
                errors.append(f"{key} {values[key]!r} is not one of: {', '.join(choices)}")
    if "credential" in values:
        row.credential = str(values["credential"])
        if row.credential not in credentials:
            errors.append(f"credential {row.credential!r} does not exist; create it first (admin: Credentials)")
    if "site" in values:
        row.site, error = _text("site", values["site"])
        if error:
            errors.append(error)
    if "tags" in values:
        row.tags, tag_errors = _tags(values["tags"])
        errors += tag_errors
    return errors


def _text(key: str, value: Any) -> tuple[str, str]:
    """(text, "") or ("", error). YAML may read a name like 007 as a number: numbers are taken as text."""
    if isinstance(value, bool) or not isinstance(value, str | int | float):
        return "", f"{key} must be text, not {value!r}"
    text = str(value).strip()
    model = Site if key == "site" else Node
    limit = getattr(model._meta.get_field("name" if key == "site" else key), "max_length", None)
    if limit and len(text) > limit:
        return "", f"{key} is longer than {limit} characters"
    return text, ""


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def _tags(value: Any) -> tuple[list[str], list[str]]:
    if isinstance(value, str):
        value = value.split(";")
    if not isinstance(value, list):
        return [], [f"tags must be a list, not {value!r}"]
    tags = [str(tag).strip() for tag in value if str(tag).strip()]
    return tags, [f"tag {tag!r} may hold only letters, digits, '-' and '_'" for tag in tags if not _TAG.match(tag)]


# --- applying ---------------------------------------------------------------------------------


def _apply(row: _Row) -> Node:
    fields = dict(row.fields)
    name = fields.pop("name")
    if row.credential:
        fields["credential"] = Credential.objects.get(name=row.credential)
    if row.site:
        fields["site"] = services.site_ensure(name=row.site)
    return services.node_upsert(name=name, tags=row.tags, **fields)
