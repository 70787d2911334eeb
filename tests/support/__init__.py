"""What the tests share: oracles, strategies, engine stand-ins, fixtures' paths."""
