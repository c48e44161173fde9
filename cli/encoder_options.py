"""The encoder flags every model-loading command shares (encode, index build, serve).

One dataclass holds them and one decorator adds them to a typer command, so the
flags, their help and their defaults are written once::

    @app.command("build")
    @with_encoder_options
    def build(corpus: Path, encoder: EncoderOptions) -> None:
        enc = encoder.load()          # == encoder.loading.load_encoder(...)

The decorated command gets the flags ``--model --kind --skip-mlm/--no-skip-mlm
--agg-dim --dlr-dim --lambda --dense-model --pooling --normalize/--no-normalize
--device --max-query-length --max-passage-length`` and receives them as one
``encoder: EncoderOptions`` argument. ``None`` means "not given": the model
directory's ``densehybrid.json`` (or the zoo's defaults) decides.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import asdict, dataclass, fields
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Optional

import typer

if TYPE_CHECKING:
    from densehybrid.encoder.base import Encoder


class KindChoice(str, Enum):
    aggretriever = "aggretriever"
    dhr = "dhr"
    dlr = "dlr"
    fusion = "fusion"
    cls = "cls"


class PoolingChoice(str, Enum):
    cls = "cls"
    mean = "mean"


@dataclass(frozen=True)
class EncoderOptions:
    """The arguments of :func:`encoder.loading.load_encoder`, as given on a command line."""

    model: Optional[str] = None
    kind: Optional[str] = None
    skip_mlm: Optional[bool] = None
    agg_dim: int = 640
    dlr_dim: int = 768
    lam: Optional[float | str] = None  # a number, or "auto" (index build chooses λ from the corpus)
    dense_model: Optional[str] = None
    pooling: Optional[str] = None
    normalize: Optional[bool] = None
    device: Optional[str] = None
    max_query_length: Optional[int] = None
    max_passage_length: Optional[int] = None

    def load_kwargs(self) -> dict:
        """Keyword arguments for ``load_encoder`` (everything but ``model``)."""
        kwargs = asdict(self)
        del kwargs["model"]
        if kwargs["lam"] == "auto":  # the encoder keeps its own λ; only an index build resolves "auto"
            kwargs["lam"] = None
        return kwargs

    def load(self) -> "Encoder":
        """Load the encoder these options describe."""
        from densehybrid.encoder.loading import load_encoder

        if not self.model:
            raise typer.BadParameter("--model is required (a zoo name, a local directory or a hub id)")
        return load_encoder(self.model, **self.load_kwargs())

    def to_dict(self) -> dict:
        return asdict(self)

    def fixed_lambda(self, command: str) -> float | None:
        """λ for a command that has no corpus to choose it from (search, eval, serve)."""
        if self.lam == "auto":
            raise ValueError(f"--lambda auto chooses λ from the corpus at 'index build' only; give {command} a "
                             "number (e.g. --lambda 0.5) or leave it out to use the index's λ")
        return self.lam

    def serve_settings(self) -> dict:
        """The options given, as ServiceSettings fields (None and the dimension defaults mean 'not given')."""
        defaults = {f.name: f.default for f in fields(self)}
        given = {name: value for name, value in asdict(self).items() if value is not None and value != defaults[name]}
        if "lam" in given:
            given["lam"] = self.fixed_lambda("serve")
        return given


# name -> (annotation with its typer.Option, default); the order is the --help order
_OPTIONS: dict[str, tuple[object, object]] = {
    "model": (Annotated[Optional[str], typer.Option(
        "--model", "-m", help="zoo name (splade-tiny, minilm), local model directory, or hub id")], None),
    "kind": (Annotated[Optional[KindChoice], typer.Option(
        "--kind", help="representation; needed only when the model directory does not record it")], None),
    "skip_mlm": (Annotated[Optional[bool], typer.Option(
        "--skip-mlm/--no-skip-mlm", help="Aggretriever 'w/o MLM': lexical part without the MLM head")], None),
    "agg_dim": (Annotated[int, typer.Option("--agg-dim", help="Aggretriever aggregated dims")], 640),
    "dlr_dim": (Annotated[int, typer.Option("--dlr-dim", help="DLR dims (dhr, dlr, fusion)")], 768),
    "lam": (Annotated[Optional[str], typer.Option(
        "--lambda", parser=lambda text: parse_lambda(text), metavar="FLOAT|auto",
        help="weight of the query's dense part (dhr, fusion; default 1.0); 'auto' at index build: "
             "chosen from the corpus")], None),
    "dense_model": (Annotated[Optional[str], typer.Option(
        "--dense-model", help="fusion: the dense model (zoo name, directory or hub id)")], None),
    "pooling": (Annotated[Optional[PoolingChoice], typer.Option(
        "--pooling", help="cls kind (and fusion's dense half): [CLS] or mean pooling")], None),
    "normalize": (Annotated[Optional[bool], typer.Option(
        "--normalize/--no-normalize", help="cls kind: L2-normalise the pooled vector")], None),
    "device": (Annotated[Optional[str], typer.Option(
        "--device", help="cpu, cuda, cuda:N or auto (default: CUDA when present)")], None),
    "max_query_length": (Annotated[Optional[int], typer.Option(
        "--max-query-length", help="query tokens kept (default 32)")], None),
    "max_passage_length": (Annotated[Optional[int], typer.Option(
        "--max-passage-length", help="passage tokens kept (default 128)")], None),
}
assert list(_OPTIONS) == [f.name for f in fields(EncoderOptions)]


def parse_lambda(text: str) -> float | str:
    """``--lambda``: a finite number, or ``auto``."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        value = float(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a number nor 'auto'") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise typer.BadParameter(f"{text!r} is not a finite number")
    return value


def _plain(value: object) -> object:
    return value.value if isinstance(value, Enum) else value


def with_encoder_options(command):
    """Decorate a typer command that takes ``encoder: EncoderOptions`` to expose the shared flags."""
    signature = inspect.signature(command)
    if "encoder" not in signature.parameters:
        raise TypeError(f"{command.__name__} must take an 'encoder: EncoderOptions' parameter")
    own = [p for name, p in signature.parameters.items() if name != "encoder"]
    added = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation)
             for name, (annotation, default) in _OPTIONS.items()]

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        options = EncoderOptions(**{name: _plain(kwargs.pop(name)) for name in _OPTIONS})
        return command(*args, encoder=options, **kwargs)

    wrapper.__signature__ = signature.replace(parameters=[*own, *added])
    # typer resolves annotations with typing.get_type_hints(wrapper): the command's own
    # (possibly string) annotations resolve in its module, the added ones are objects
    annotations = {k: v for k, v in command.__annotations__.items() if k != "encoder"}
    annotations.update({p.name: p.annotation for p in added})
    wrapper.__annotations__ = annotations
    return wrapper
