"""The `streamtrain` command: one entry point for the services, the job processes and the demo."""
