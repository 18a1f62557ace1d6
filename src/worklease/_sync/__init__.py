# Generated from src/worklease/_async/__init__.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".

"""One flavour of the lease engine (see ``scripts/unasync.py``); import from ``worklease``."""
