"""Run the ``densehybrid`` command as on an install without a runtime extra: neither Faiss nor ONNX
Runtime can be imported, and their distributions are not installed.

    python tests/support/without_runtime_extra.py serve --index DIR
"""

import importlib.abc
import importlib.metadata
import sys

ABSENT_MODULES = {"faiss", "onnxruntime", "onnx"}
ABSENT_DISTRIBUTIONS = {"faiss-cpu", "onnxruntime", "onnxruntime-gpu", "onnx"}


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT_MODULES:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def version(distribution: str) -> str:
    if distribution in ABSENT_DISTRIBUTIONS:
        raise importlib.metadata.PackageNotFoundError(distribution)
    return installed_version(distribution)


installed_version = importlib.metadata.version
importlib.metadata.version = version
sys.meta_path.insert(0, Absent())
sys.argv = ["densehybrid", *sys.argv[1:]]

from densehybrid.cli.launcher import main  # noqa: E402  (after the import blocker is in place)

main()
