"""Past one process: the fleet cut into shards, each owned through its own Lease."""
