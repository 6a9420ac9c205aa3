"""Shared helpers of env-ab: hashing, atomic writes, receipts, configuration.

Every stage imports these rather than keeping its own copy, so a digest means the same thing
in the freeze stage, the trainer and `verify`.
"""
