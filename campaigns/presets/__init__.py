"""Ready-made campaigns from the reference papers, instantiated against the user's own inventory.

A preset file holds ``preset:`` (title, seed, description, needs) and ``campaigns:``, a list of campaign
definitions in the YAML format of campaigns.spec without name, nodes or storage. A suite (several
campaigns) names each part with ``suffix``; its campaigns are called ``NAME-SUFFIX``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

PRESET_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Preset:
    slug: str
    title: str
    seed: str
    description: str
    needs: list[str]
    campaigns: list[dict[str, Any]]

    def definition(self, part: dict[str, Any], *, name: str) -> dict[str, Any]:
        """One of its campaigns as a definition called ``name`` (``NAME-SUFFIX`` in a suite), described and in
        the family every instance of this part shares; nodes and storage are the caller's."""
        suffix = part.get("suffix", "")
        data = {"name": f"{name}-{suffix}" if suffix else name}
        data.update((k, v) for k, v in part.items() if k != "suffix")
        data.setdefault("description", f"{self.title} (preset {self.slug}; seed {self.seed})")
        data.setdefault("family", f"{self.slug}-{suffix}" if suffix else self.slug)
        return data


def preset_list() -> list[Preset]:
    return [_load(path) for path in sorted(PRESET_DIR.glob("*.yaml"))]


def preset_get(slug: str) -> Preset | None:
    path = PRESET_DIR / f"{slug}.yaml"
    return _load(path) if path.is_file() and path.parent == PRESET_DIR else None


def _load(path: Path) -> Preset:
    data = yaml.safe_load(path.read_text())
    meta = data["preset"]
    return Preset(
        slug=path.stem,
        title=meta["title"],
        seed=str(meta.get("seed", "")),
        description=meta.get("description", "").strip(),
        needs=list(meta.get("needs", ["nodes"])),
        campaigns=list(data["campaigns"]),
    )
