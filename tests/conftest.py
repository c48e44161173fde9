"""Shared fixtures. Real offline models are fetched once per machine into the cache."""

import logging

import pytest
import torch

torch.set_num_threads(2)


# Fixtures that make any test using them slow: the offline real models (fetched and loaded), a headless
# browser, a built wheel, a full quick benchmark run. ``-m "not slow"`` leaves these tests out.
REAL_MODEL_FIXTURES = {"splade_tiny_dir", "minilm_dir"}
SLOW_FIXTURES = REAL_MODEL_FIXTURES | {"browser", "wheel", "quick_results"}


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="no CUDA device on this machine; the CPU twin of this test runs instead")
    for item in items:
        used = set(getattr(item, "fixturenames", ()))
        if used & REAL_MODEL_FIXTURES:
            item.add_marker(pytest.mark.realmodel)
        if "milvus_server" in used:
            item.add_marker(pytest.mark.milvus_server)
        if item.get_closest_marker("milvus_server"):
            item.add_marker(pytest.mark.slow)
        if used & SLOW_FIXTURES or item.get_closest_marker("realmodel"):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def cpu_reference(request, monkeypatch):
    """CPU float32 is the reference: every test not marked ``gpu`` runs on the CPU, also where CUDA
    is visible (there the encoders would pick CUDA and fp16 autocast, outside the float32 tolerances).
    Server subprocesses inherit the same through CUDA_VISIBLE_DEVICES."""
    if request.node.get_closest_marker("gpu"):
        return
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def root_logging_restored():
    """`serve` configures the root logger for the process; later CLI tests must not inherit it."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.fixture
def fake_models(monkeypatch):
    """The test-only switch: ``--model fake:KIND`` loads the deterministic FakeEncoder.

    Production code has no such model id; without this fixture ``fake:KIND`` is an unknown model.
    """
    from support.fake_encoder import FakeEncoder
    from densehybrid.index.building import commands

    real_load = commands.load_model

    def load(config, device=None, **runtime):
        if config.model.startswith(("fake:", "fake-")):
            return FakeEncoder(config.model[len("fake:"):], lam=config.lam or 1.0)
        return real_load(config, device, **runtime)

    monkeypatch.setattr(commands, "load_model", load)


@pytest.fixture(scope="module")
def client(server):
    """An HTTP client of the module's live ``server`` fixture."""
    import httpx

    with httpx.Client(base_url=server.url, timeout=30) as c:
        yield c


@pytest.fixture(scope="session")
def toy_index(tmp_path_factory):
    """``toy_index(kind="dhr", count=80, lam=1.0)``: the directory of a small FakeEncoder index of the
    bench's toy corpus, built once per session for each argument set. Shared: serve or search it, never
    write to it (a test that writes builds its own with ``build_toy_index``)."""
    from densehybrid.bench.servers.toy_index import build_toy_index
    from support.fake_encoder import FakeEncoder

    built = {}

    def get(kind: str = "dhr", count: int = 80, lam: float = 1.0):
        if (kind, count, lam) not in built:
            root = tmp_path_factory.mktemp(f"toy-{kind}-{count}")
            built[kind, count, lam] = build_toy_index(FakeEncoder(kind, lam=lam), root, count=count)
        return built[kind, count, lam]

    return get


@pytest.fixture(scope="session")
def splade_tiny_dir():
    from densehybrid.encoder import zoo
    return zoo.fetch("splade-tiny")


@pytest.fixture(scope="session")
def minilm_dir():
    from densehybrid.encoder import zoo
    return zoo.fetch("minilm")


# -- tiny random checkpoints in the published castorini format (encoder tests) --
@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory):
    from densehybrid.encoder.random_checkpoint import write_random_checkpoint
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "bert", arch="bert", seed=1)


@pytest.fixture(scope="session")
def tiny_distilbert_dir(tmp_path_factory):
    from densehybrid.encoder.random_checkpoint import write_random_checkpoint
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "distilbert", arch="distilbert", seed=2)


@pytest.fixture(scope="session")
def tiny_untied_dir(tmp_path_factory):
    from densehybrid.encoder.random_checkpoint import write_random_checkpoint
    return write_random_checkpoint(tmp_path_factory.mktemp("tiny") / "untied", arch="bert", untied=True,
                                   tied_heads=False, seed=3)


# -- Milvus: Milvus Lite (a database file) and a real Milvus server, started once per run --
@pytest.fixture(scope="session")
def milvus_server(tmp_path_factory):
    """The run's real Milvus server (tests marked ``milvus_server``), started on first use, stopped at the end.
    Without one the test skips, naming why; under CI=true it fails."""
    from support.milvus_server import start_server

    server = start_server(tmp_path_factory.mktemp("milvus-server"))
    yield server
    server.kill()  # its data goes with the run


@pytest.fixture(scope="module", params=["lite", pytest.param("server", marks=pytest.mark.milvus_server)])
def milvus_target(request, tmp_path_factory):
    """Where the module's Milvus tests export, once on each: Milvus Lite, and the real server (emptied first)."""
    from support.milvus_server import MilvusTarget

    root = tmp_path_factory.mktemp(f"milvus-{request.param}")
    if request.param == "lite":
        return MilvusTarget("lite", root)
    server = request.getfixturevalue("milvus_server")
    server.ensure_running()
    server.drop_all()
    return MilvusTarget("server", root, server)
