"""The feeder: keeps the learner fed from a mix of domains, resume-safe."""
