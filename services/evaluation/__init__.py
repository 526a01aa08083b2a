"""Evaluation on held-out problems: a domain's eval split, run through the live stack."""
