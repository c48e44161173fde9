"""numpy's BLAS held to one thread in a serving process.

numpy's wheels ship OpenBLAS with a thread pool of its own (pthreads). A server runs many searches at once, one
per request thread, and a search's exact rescoring is a small matrix-vector product (a few hundred rows by the
dims). OpenBLAS splits such a product over its pool, and callers from several threads at once queue for that
one pool: on the shared 2-core machine, rescoring 925 rows of 768 dims ran 560 times a second from one caller
and 83 times a second from eight with the pool's two threads, against 1,086 with one thread. A pqscan index of
207k DLR rows, searched by 32 threads at once, answered 42 queries/s, and 273 with one BLAS thread (380 from
one thread either way). With one BLAS thread each caller computes its own product, and the cores are shared
out by the searches instead. So a server with more than one search thread limits it; with one search thread
(the default: concurrent searches are batched into one call) a batch's products keep the pool.

Only a BLAS with a pool of its own is limited. Faiss ships OpenBLAS built on OpenMP, which runs inside Faiss's
own parallel regions: limiting it would set OpenMP's thread count, which Faiss's batched scans and builds use.
torch keeps its own threads too.
"""

from __future__ import annotations

import logging

from threadpoolctl import ThreadpoolController

log = logging.getLogger(__name__)


def one_thread_for_pooled_blas() -> list[str]:
    """Limit every BLAS library loaded in this process that keeps a pthreads pool of its own (numpy's OpenBLAS)
    to one thread, for the life of the process; the file names of the libraries limited."""
    limited = []
    for library in ThreadpoolController().lib_controllers:
        if library.user_api == "blas" and getattr(library, "threading_layer", None) == "pthreads":
            library.set_num_threads(1)
            limited.append(library.filepath)
    if limited:
        log.info("numpy's BLAS limited to one thread a product (requests run side by side): %s", ", ".join(limited))
    return limited
