"""One module per command of `hisparse-plan`: its flags, the library call, its output.
May import every room; what differs by engine it takes from `cli/engines.py`."""
