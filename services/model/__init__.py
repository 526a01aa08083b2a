"""The policy's model code that every service shares.

``load``: loading a causal LM (one dtype policy, one lock) and a learned reward model;
``weights``: a weight directory's files, digest, reading, checking and writing (tied
tensors saved once); ``tokens``: text <-> token ids through a model directory's own
tokenizer; ``tiny``: the tiny Qwen2 policy ``temper model init`` builds locally; ``sft``:
the supervised warm-up; ``greedy``: greedy answers and held-out accuracy in this process.
"""
