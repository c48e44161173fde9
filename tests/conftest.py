"""Shared fixtures. Real offline models are fetched once per machine into the cache."""

import pytest
import torch

torch.set_num_threads(2)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="no CUDA device on this machine; the CPU twin of this test runs instead")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def splade_tiny_dir():
    from encoder import zoo
    return zoo.fetch("splade-tiny")


@pytest.fixture(scope="session")
def minilm_dir():
    from encoder import zoo
    return zoo.fetch("minilm")
