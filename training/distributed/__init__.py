"""Distribution: the process group, FSDP2 sharding and context parallelism."""
