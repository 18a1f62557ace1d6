"""The asyncio flavour: the hand-written source the sync flavour is generated from."""
