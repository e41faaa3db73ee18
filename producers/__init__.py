"""Producers: turn raw logs into example records on a topic; they never know training exists."""
