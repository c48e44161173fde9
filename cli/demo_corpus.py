"""A corpus every machine has: the docstrings of the Python standard library.

Passages are the docstrings of stdlib modules and of their public classes,
methods and functions, in a fixed order, as BEIR ``corpus.jsonl`` lines (``_id`` is the
qualified name). Each line's ``metadata`` holds the passage's ``module`` and ``kind`` (module,
class, function or method), which the demo index keeps as filterable fields.
Modules with side effects on import are never imported.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import logging
import pkgutil
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

# importing these opens windows or browsers, prints, or drags in optional toolkits
SKIP_MODULES = frozenset({"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "lib2to3",
                          "ensurepip", "pydoc_data", "test", "msilib", "winreg", "winsound", "msvcrt", "nt",
                          "_winapi", "asyncio.__main__", "venv", "xxsubtype", "xxlimited"})
MAX_WORDS = 120


def _passage(text: str) -> str:
    """The first paragraphs of a docstring, at most MAX_WORDS words, whitespace folded."""
    return " ".join(inspect.cleandoc(text).split()[:MAX_WORDS])


def _module_docs(name: str) -> Iterator[tuple[str, str]]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            module = importlib.import_module(name)
    except Exception:  # noqa: BLE001 - platform-specific modules fail to import; skip them
        return
    if module.__doc__:
        yield name, module.__doc__
    for attr, value in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(value, "__module__", None) != name:
            continue
        if (inspect.isclass(value) or inspect.isfunction(value)) and value.__doc__:
            yield f"{name}.{attr}", value.__doc__
        if inspect.isclass(value):
            for method, member in sorted(vars(value).items()):
                if not method.startswith("_") and inspect.isfunction(member) and member.__doc__:
                    yield f"{name}.{attr}.{method}", member.__doc__


def _module_names() -> list[str]:
    """Public stdlib modules and the public modules of stdlib packages (one level down)."""
    names = []
    for top in sorted(n for n in sys.stdlib_module_names if not n.startswith("_") and n not in SKIP_MODULES):
        names.append(top)
        spec = importlib.util.find_spec(top)
        if spec is not None and spec.submodule_search_locations:
            subs = pkgutil.iter_modules(spec.submodule_search_locations)
            names += sorted(f"{top}.{m.name}" for m in subs if not m.name.startswith("_") and "test" not in m.name
                            and f"{top}.{m.name}" not in SKIP_MODULES)
    return names


# the payload fields of the demo corpus (``index build --field``)
FIELDS = ("module", "kind")


def _kind(module: str, qualified: str) -> str:
    """module, class, function or method: what a docstring of ``_module_docs(module)`` documents."""
    parts = qualified[len(module):].lstrip(".").split(".") if qualified != module else []
    if not parts:
        return "module"
    if len(parts) > 1:
        return "method"
    return "class" if inspect.isclass(getattr(sys.modules[module], parts[0], None)) else "function"


def stdlib_passages(limit: int) -> Iterator[dict]:
    """Up to ``limit`` passages ``{"_id", "title", "text", "metadata"}`` with at least 8 words each."""
    count = 0
    for name in _module_names():
        for qualified, doc in _module_docs(name):
            text = _passage(doc)
            if len(text.split()) < 8:
                continue
            yield {"_id": qualified, "title": qualified, "text": text,
                   "metadata": {"module": name, "kind": _kind(name, qualified)}}
            count += 1
            if count >= limit:
                return


def write_stdlib_corpus(path: Path, limit: int = 2000) -> int:
    """Write the corpus; returns the number of passages written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    written = 0
    with open(path, "w", encoding="utf-8") as f:
        for passage in stdlib_passages(limit):
            f.write(json.dumps(passage, ensure_ascii=False) + "\n")
            written += 1
    log.info("wrote %d stdlib docstring passages to %s", written, path)
    return written
