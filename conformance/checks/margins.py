"""Margins that memory bounds allow, shared by the areas that bound bytes."""

# 0-d scalars a rank may hold beside its tensors; on CUDA rounded up
# to one allocator block (storages.allocated_bytes) where it is added to a reading
SLACK_BYTES = 256
# how far a CUDA setup peak may exceed the kit's estimate of it under FSDP's real init (the
# caching allocator can serve a tensor from a larger cached block); on CPU the bound is exact
ESTIMATE_FACTOR = 1.25
