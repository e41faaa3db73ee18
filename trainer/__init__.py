"""Trainers: claim tasks, read exact offset ranges, train with PyTorch, publish gradient deltas
exactly once through Kafka transactions (docs/architecture.md)."""
