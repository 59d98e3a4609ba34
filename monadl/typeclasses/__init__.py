"""Type classes the library is written against, depending on nothing else of it: the array backend
(namespaces, checks, broadcasting's vjp) and sparse deltas (an embedding table's rows)."""
