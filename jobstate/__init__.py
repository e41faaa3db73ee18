"""The state of a job that every process shares, above schemas and infra and below master,
pserver and trainer (docs/architecture.md, "Layers"): the etcd client,
membership, the task queue's client and rules, input offsets, the slot map, the parameters in
Redis and their client, the update rules, metrics. (The job config is a document every process
reads: schemas/config.py.)"""
