"""Sandbox pool: isolated execution of model-written code (see services/sandbox/agent/)."""
