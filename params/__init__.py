"""The job's parameters, above jobstate and below master, pserver and trainer
(docs/architecture.md, "Layers"): the update rules and their compiled kernels, row tables, the
average of dense blocks that is scored, and the parameters in Redis with the client that pulls
them (its RESP, which node holds a shard, waiting for what shards announce)."""
