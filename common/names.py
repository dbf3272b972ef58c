"""Names that become parts of paths (campaigns, families, nodes, storage systems): one rule for all of them, and the
one way remote paths are built from them so that no name can leave the directory it is put under."""

from __future__ import annotations

import posixpath
import re

from common.errors import FieldError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit, up to 100 characters"


def name_problem(value: object) -> str | None:
    """What is wrong with ``value`` as a name, in words ("required" only when there is none); None when it is valid."""
    if value is None or value == "":
        return f"required: {NAME_RULE}"
    if not isinstance(value, str):
        return f"must be text, not {type(value).__name__} ({NAME_RULE})"
    if NAME_RE.match(value):
        return None
    if len(value) > 100:
        return f"is {len(value)} characters long: at most 100"
    bad = sorted(set(re.sub(r"[A-Za-z0-9._-]", "", value)))
    if bad:
        shown = ", ".join("a space" if c == " " else repr(c) for c in bad)
        return f"{value!r} contains {shown}: only letters, digits, '.', '_' or '-' are allowed"
    return f"{value!r} starts with {value[0]!r}: a name starts with a letter or digit"


def name_check(field: str, value: object) -> str:
    """``value`` when it is a valid name; a FieldError naming ``field`` and what is wrong otherwise. A valid name is
    one path component that is neither ``.`` nor ``..`` (it cannot start with a dot) and holds no ``/``."""
    problem = name_problem(value)
    if problem:
        raise FieldError(field, problem)
    return value  # type: ignore[return-value]  # name_problem found it a str


def path_under(root: str, *parts: str) -> str:
    """``root`` joined with ``parts``, each a valid name (``name_check``: one path component, never ``..``); a
    FieldError when a part is not one or the normalised result is not inside ``root``."""
    for part in parts:
        if not isinstance(part, str) or not NAME_RE.match(part):
            raise FieldError("name", f"{part!r} is not a valid name: {name_problem(part)}")
    base = posixpath.normpath(root)
    path = posixpath.normpath(posixpath.join(base, *parts))
    if posixpath.commonpath([base, path]) != base or path == base:
        raise FieldError("name", f"{'/'.join(parts)!r} leaves {root}")
    return path
