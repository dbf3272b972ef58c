"""Names that become parts of paths (campaigns, families, nodes, storage systems): one rule for all of them, and the
one way remote paths are built from them so that no name can leave the directory it is put under."""

from __future__ import annotations

import posixpath
import re

from common.errors import FieldError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
NAME_RULE = "letters, digits, '.', '_' or '-', starting with a letter or digit, up to 100 characters"


def name_check(field: str, value: object) -> str:
    """``value`` when it is a valid name; a FieldError naming ``field`` otherwise. A valid name is one path component
    that is neither ``.`` nor ``..`` (it cannot start with a dot) and holds no ``/``."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise FieldError(field, NAME_RULE)
    return value


def path_under(root: str, *parts: str) -> str:
    """``root`` joined with ``parts``, each a valid name (``name_check``: one path component, never ``..``); a
    FieldError when a part is not one or the normalised result is not inside ``root``."""
    for part in parts:
        if not isinstance(part, str) or not NAME_RE.match(part):
            raise FieldError("name", f"{part!r} is not a valid name ({NAME_RULE})")
    base = posixpath.normpath(root)
    path = posixpath.normpath(posixpath.join(base, *parts))
    if posixpath.commonpath([base, path]) != base or path == base:
        raise FieldError("name", f"{'/'.join(parts)!r} leaves {root}")
    return path
