"""Learner: GRPO / decoupled PPO on torch; publishes policy versions."""
