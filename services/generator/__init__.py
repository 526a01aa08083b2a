"""Generator: tasks in, rollouts out, on an SGLang or torch engine."""
