"""densehybrid: an online retrieval service for Aggretriever, DHR and [CLS] single-vector retrievers.

The repository keeps one folder per layer (encoder/, index/, service/, cli/, benchmarks/);
pyproject.toml maps them under this one import name: ``densehybrid.encoder``,
``densehybrid.index``, ``densehybrid.service``, ``densehybrid.cli`` and ``densehybrid.bench``.
Imports point one way: cli -> bench -> service -> index -> encoder.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("densehybrid")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"
