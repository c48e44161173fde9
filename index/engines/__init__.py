"""One module per search engine, each with its :class:`~densehybrid.index.search.vector_store.VectorStore`:
``faiss_engine`` (CPU, exact), ``hnsw_engine`` and ``pqscan_engine`` (approximate, CPU), ``torch_engine``
(exact, CPU or GPU), ``milvus_engine`` (a collection); ``host`` holds what the local stores share."""
