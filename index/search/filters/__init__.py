"""Search filters over payload columns: the grammar (parse and type-check), row masks for local stores,
and Milvus expressions. Callers use this package's names; each job lives in its own module."""

from densehybrid.index.search.filters.grammar import (MAX_DEPTH, MAX_IN_VALUES, MAX_NODES, RANGE_OPS, And, Eq,
                                                      Exists, Filter, FilterError, In, Not, Or, Range, check_size,
                                                      parse, unknown_field)
from densehybrid.index.search.filters.milvus import milvus_field, milvus_present, to_milvus
from densehybrid.index.search.filters.rows import Selection, evaluate, row_mask, rows_below, select_rows

__all__ = ["MAX_DEPTH", "MAX_IN_VALUES", "MAX_NODES", "RANGE_OPS", "And", "Eq", "Exists", "Filter", "FilterError",
           "In", "Not", "Or", "Range", "Selection", "check_size", "evaluate", "milvus_field", "milvus_present",
           "parse", "row_mask", "rows_below", "select_rows", "to_milvus", "unknown_field"]
