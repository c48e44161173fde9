"""numpy's BLAS on one thread a product when searches run side by side, and nothing else limited."""

import numpy as np
from threadpoolctl import ThreadpoolController

from densehybrid.service.blas import one_thread_for_pooled_blas
from densehybrid.service.settings import ServiceSettings
from densehybrid.service.startup import build_runtime
from support.fake_encoder import FakeEncoder


def threads_by_library() -> dict[str, tuple[str | None, int]]:
    return {lib.filepath: (getattr(lib, "threading_layer", None), lib.num_threads)
            for lib in ThreadpoolController().lib_controllers}


def restore(before: dict[str, tuple[str | None, int]]) -> None:
    for lib in ThreadpoolController().lib_controllers:
        lib.set_num_threads(before[lib.filepath][1])


def test_only_a_blas_with_its_own_pthreads_pool_is_limited():
    np.ones((4, 4)) @ np.ones(4)  # numpy's BLAS is loaded
    before = threads_by_library()
    try:
        limited = one_thread_for_pooled_blas()
        after = threads_by_library()
        assert limited and all(before[path][0] == "pthreads" and after[path][1] == 1 for path in limited)
        for path, (layer, threads) in before.items():
            if path not in limited:  # Faiss's OpenBLAS on OpenMP, OpenMP itself: as they were
                assert after[path] == (layer, threads)
    finally:
        restore(before)


def test_a_server_limits_numpy_s_blas_only_with_more_than_one_search_thread(monkeypatch):
    calls = []
    monkeypatch.setattr("densehybrid.service.startup.one_thread_for_pooled_blas", lambda: calls.append(1))
    build_runtime(ServiceSettings(search_threads=1), FakeEncoder())
    assert calls == []
    build_runtime(ServiceSettings(search_threads=4), FakeEncoder())
    assert calls == [1]
