"""Prompts: text put before each input so the model knows its role (E5's "query: " / "passage: ",
or an instruction such as "Represent this question for retrieving passages: ").

An index records its prompts (the shape of sentence-transformers' ``config_sentence_transformers.json``:
``{"prompts": {name: text}, "default_prompt_name": name or null}``) and every encode of that index
applies them, so a query is never encoded with a prompt its passages were not built for:

- passages use the prompt named ``passage`` (nothing when there is none);
- queries use ``default_prompt_name``'s prompt, else the one named ``query`` (nothing when neither).

A request may name a prompt (``prompt_name``): for queries any recorded name, for passages only
``passage``; an unknown name is an error, never ignored. The prompt's tokens count toward the
role's max length and are never cut by truncation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from densehybrid.encoder.choices import Role

QUERY_NAME, PASSAGE_NAME = "query", "passage"


class PromptError(ValueError):
    """A prompt name that the prompts in force do not define, or one the role may not use."""


@dataclass(frozen=True)
class Prompts:
    prompts: Mapping[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None

    def __post_init__(self):
        for name, text in self.prompts.items():
            if not isinstance(name, str) or not name or not isinstance(text, str):
                raise PromptError(f"a prompt needs a non-empty name and a text, got {name!r}: {text!r}")
        if self.default_prompt_name is not None and self.default_prompt_name not in self.prompts:
            raise PromptError(f"default_prompt_name {self.default_prompt_name!r} is not one of the prompts "
                              f"{sorted(self.prompts)}")

    @classmethod
    def of(cls, query: str | None = None, passage: str | None = None, named: Mapping[str, str] | None = None,
           default_prompt_name: str | None = None) -> "Prompts":
        """Prompts from ``--query-prompt``, ``--passage-prompt`` and ``--prompt NAME=TEXT`` (the role flags win)."""
        prompts = dict(named or {})
        for name, text in ((QUERY_NAME, query), (PASSAGE_NAME, passage)):
            if text is not None:
                prompts[name] = text
        return cls(prompts, default_prompt_name)

    @classmethod
    def from_dict(cls, data: Mapping | None) -> "Prompts":
        """The manifest's ``prompts`` entry (missing: no prompts)."""
        if not data:
            return cls()
        if not isinstance(data, Mapping) or not isinstance(data.get("prompts", {}), Mapping):
            raise PromptError(f"prompts must be {{'prompts': {{name: text}}, 'default_prompt_name': name}}, got {data!r}")
        return cls(dict(data.get("prompts", {})), data.get("default_prompt_name"))

    def to_dict(self) -> dict:
        return {"prompts": dict(self.prompts), "default_prompt_name": self.default_prompt_name}

    def __bool__(self) -> bool:
        return bool(self.prompts)

    @property
    def query_name(self) -> str | None:
        """The name of the prompt queries get, or None."""
        if self.default_prompt_name is not None:
            return self.default_prompt_name
        return QUERY_NAME if QUERY_NAME in self.prompts else None

    def role_name(self, role: Role) -> str | None:
        if role == "query":
            return self.query_name
        return PASSAGE_NAME if PASSAGE_NAME in self.prompts else None

    def for_role(self, role: Role) -> str:
        name = self.role_name(role)
        return "" if name is None else self.prompts[name]

    def resolve(self, role: Role, prompt_name: str | None) -> str:
        """The prompt text for ``role`` when a request names ``prompt_name`` (None: the role's prompt)."""
        if prompt_name is None:
            return self.for_role(role)
        if prompt_name not in self.prompts:
            known = ", ".join(repr(n) for n in sorted(self.prompts)) or "none"
            raise PromptError(f"prompt_name {prompt_name!r} is not defined here (prompts: {known})")
        if role == "passage" and prompt_name != PASSAGE_NAME:
            raise PromptError(f"prompt_name {prompt_name!r} cannot encode passages: passages always get the "
                              f"{PASSAGE_NAME!r} prompt, as the index's passages did")
        return self.prompts[prompt_name]

    def check_search(self, prompt_name: str | None) -> str:
        """The query prompt of a search; a ``prompt_name`` other than the index's query prompt is refused."""
        if prompt_name is not None and prompt_name != self.query_name:
            raise PromptError(f"prompt_name {prompt_name!r} is not this index's query prompt "
                              f"({self.query_name!r}); searches always use it (leave prompt_name out)")
        return self.for_role("query")
