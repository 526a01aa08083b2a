"""The gateway: OpenAI-compatible HTTP for the agents users already have (docs/gateway.md)."""
