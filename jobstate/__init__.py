"""The coordination every process of a job shares, above schemas and infra and below params,
master, pserver and trainer (docs/architecture.md, "Layers"): the etcd client, membership, the
task client and the queue's rules, input offsets, the slot map, job-wide checkpoints, the job's
own topics and its status. (The job config is a document every process reads:
schemas/config.py; the parameters are params/.)"""
