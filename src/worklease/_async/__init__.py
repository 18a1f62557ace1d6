"""One flavour of the lease engine (see ``scripts/unasync.py``); import from ``worklease``."""
