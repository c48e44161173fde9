"""Command-line flags generated from the settings model (``service.settings.ServiceSettings``).

Each field becomes one ``--flag`` named like the field (``max_batch_size`` ->
``--max-batch-size``; booleans get ``--x/--no-x``), with the field's description
as help and its default shown. Every flag defaults to ``None`` ("not given"), so
a flag left out never overrides the environment (``DENSEHYBRID_*``); pydantic then
validates. Names that read better otherwise are listed in :data:`FLAG_NAMES`.

:func:`with_flags` adds the flags of some fields to a typer command and hands them
to it as one ``dict``: ``serve`` takes every field, the model-loading commands
the encoder's (``cli.encoder_options``).
"""

from __future__ import annotations

import functools
import inspect
import types
from enum import Enum
from typing import Annotated, Callable, Literal, Optional, Union, get_args, get_origin

import typer
from pydantic import SecretStr

from densehybrid.service.settings import ServiceSettings

# the flags whose names are not the field's (a short form, a clearer word, a singular for a repeated flag)
FLAG_NAMES: dict[str, tuple[str, ...]] = {
    "model": ("--model", "-m"),
    "index": ("--index", "-i"),
    "port": ("--port", "-p"),
    "lam": ("--lambda",),
    "allow_open": ("--allow-open/--require-key",),
    "log_json": ("--log-json/--log-plain",),
    "cors_origins": ("--cors-origin",),
}


def parse_lambda(text: str) -> float | str:
    """``--lambda``: a finite number, or ``auto`` (chosen from the corpus, at index build only)."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a number nor 'auto'") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise typer.BadParameter(f"{text!r} is not a finite number")
    return value


# typer.Option arguments beyond name, help and default, by field
EXTRA: dict[str, dict] = {
    "lam": {"parser": parse_lambda, "metavar": "FLOAT|auto"},
}


def _value_type(annotation) -> type:
    """``X | None`` -> X; a ``Literal`` -> an Enum of its values (typer turns it into a choice)."""
    if get_origin(annotation) in (Union, types.UnionType):
        (annotation,) = [a for a in get_args(annotation) if a is not type(None)]
    if get_origin(annotation) is Literal:
        values = get_args(annotation)
        return Enum("Choice_" + "_".join(values), {v: v for v in values}, type=str)
    if annotation is SecretStr:
        return str
    return annotation


def _flag_names(name: str, value_type: type) -> tuple[str, ...]:
    if name in FLAG_NAMES:
        return FLAG_NAMES[name]
    flag = "--" + name.replace("_", "-")
    return (f"{flag}/--no-{flag[2:]}",) if value_type is bool else (flag,)


def _shown_default(field) -> str | bool:
    default = field.get_default(call_default_factory=True)
    if default is None or default == []:
        return False
    return str(default).lower() if isinstance(default, bool) else str(default)


def flag_parameter(name: str) -> inspect.Parameter:
    """The keyword parameter (annotation with its typer.Option) that is the flag of one settings field."""
    field = ServiceSettings.model_fields[name]
    value_type = _value_type(field.annotation)
    if name in EXTRA and "parser" in EXTRA[name]:
        value_type = str
    option = typer.Option(*_flag_names(name, value_type), help=field.description,
                          show_default=_shown_default(field), **EXTRA.get(name, {}))
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[value_type], option])


def _plain(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


def replace_parameter(command, parameter: str, added: list[inspect.Parameter], make: Callable[[dict], object]):
    """``command`` with its ``parameter`` replaced by the keyword parameters ``added``: it receives
    ``make({name: value})`` as ``parameter``."""
    signature = inspect.signature(command)
    if parameter not in signature.parameters:
        raise TypeError(f"{command.__name__} must take a {parameter!r} parameter")
    own = [p for name, p in signature.parameters.items() if name != parameter]
    names = [p.name for p in added]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        flags = {name: _plain(kwargs.pop(name)) for name in names}
        return command(*args, **{parameter: make(flags)}, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*own, *added])
    # typer resolves annotations with typing.get_type_hints(wrapper): the command's own
    # (possibly string) annotations resolve in its module, the added ones are objects
    annotations = {k: v for k, v in command.__annotations__.items() if k != parameter}
    annotations.update({p.name: p.annotation for p in added})
    wrapper.__annotations__ = annotations
    return wrapper


def with_flags(names: tuple[str, ...], parameter: str, make: Callable[[dict], object] = dict):
    """Decorate a typer command taking ``parameter``: it gets the flags of ``names`` instead, and receives
    ``make({field: value or None})`` as ``parameter``."""
    return lambda command: replace_parameter(command, parameter, [flag_parameter(name) for name in names], make)


SETTINGS_FIELDS: tuple[str, ...] = tuple(ServiceSettings.model_fields)
__all__ = ["FLAG_NAMES", "SETTINGS_FIELDS", "flag_parameter", "parse_lambda", "replace_parameter", "with_flags"]
