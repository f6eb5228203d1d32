"""The check areas: one module per area, each exposing an ``Area`` (its name, which cells it
applies to, ``check(record) -> Findings``), listed once in ``registry.py``. They read a
cell's ``CellRecord`` (``record.py``) and never import one another: what several areas need
lives in the helper modules (``storages``, ``traces``, ``dataflow``, ``margins``)."""
