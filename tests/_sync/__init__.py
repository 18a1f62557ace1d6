# Generated from tests/_async/__init__.py by scripts/unasync.py -- do not edit.
# Change the async source and run "python scripts/unasync.py".
