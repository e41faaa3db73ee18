"""Parameter-server shards: apply gradient deltas from `<job>.grad.<i>`, serve parameters from
Redis, checkpoint with their consumed offsets (docs/architecture.md)."""
