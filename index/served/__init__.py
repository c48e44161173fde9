"""The served indexes: a local directory (``local``, opened by ``loading``) and a Milvus collection (``milvus``)."""
