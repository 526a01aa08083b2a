"""Cheats a policy could find, per validator family, each scored through the real sandbox
and validator: every case asserts a score no higher than the work it does deserves."""
