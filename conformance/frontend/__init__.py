"""The pytest front end: options and hooks (``plugin``), the runner that memoizes cells on
worlds (``runner``), the verdict of one item (``verdict``), known non-conformances
(``xfails``) and the comparison with an earlier report (``baseline``). It runs in the pytest
process and never imports the rank side: a cell reaches the ranks as a task naming
``conformance.rank.entry:run_cell``."""
