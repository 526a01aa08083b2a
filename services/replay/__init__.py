"""Replay buffer: scored rollouts held until the learner takes them, within a staleness bound."""
