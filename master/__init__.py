"""The per-job master: slices input partitions into offset-range tasks kept in etcd, runs the
todo/pending/done/failed queues, and holds a fenced leader lock (docs/architecture.md)."""
