"""The prompt flags of ``index build`` (query, passage, named and default prompts) as one ``Prompts``."""

from __future__ import annotations

import typer

from densehybrid.encoder.prompts import Prompts, PromptError


def named_prompts(values: list[str] | None) -> dict[str, str]:
    named = {}
    for value in values or []:
        name, sep, text = value.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"{value!r} is not NAME=TEXT", param_hint="--prompt")
        named[name] = text
    return named


def build_prompts(query: str | None, passage: str | None, named: list[str] | None, default: str | None) -> Prompts:
    try:
        return Prompts.of(query, passage, named_prompts(named), default)
    except PromptError as exc:
        raise typer.BadParameter(str(exc), param_hint="--default-prompt-name") from None

