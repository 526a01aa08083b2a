"""Temper services and their shared runtime."""
