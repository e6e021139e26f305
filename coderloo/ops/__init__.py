"""Operations tooling beside the training driver: the memory and placement plan, cluster files,
a local multi-node cluster, and the soak's resource sampler and verdict."""
