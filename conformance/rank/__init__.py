"""The rank side of a cell: what runs inside every rank of a world when the controller
hands it a cell (``entry.run_cell``): build and compose the model (``build``), train it
beside eager PyTorch (``train``), gather full tensors from the shards (``gather``) and
measure memory along the way (``measure``), then let every check area judge the record."""
