"""What the approximate first stages' settings share: reading them back from the manifest's ``first_stage``
entry, which also holds keys that are not settings (``type``, ``file``) and may hold keys of newer
versions."""

from __future__ import annotations

from dataclasses import fields
from typing import Self


class FirstStageRecord:
    """Base of a first stage's settings dataclass."""

    @classmethod
    def from_dict(cls, record: dict) -> Self:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in names})
