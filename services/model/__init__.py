"""The policy's model and tokenizer code that every service shares.

``tiny``: the tiny Qwen2 policy ``temper model init`` builds locally; ``tokens``: text <->
token ids through a model directory's own tokenizer (the generator's agent loop, the
learner's warm-up, the validator's reward model and the CLI use the same one).
"""
