"""One request's transfer program and how it is built (match, units, serving, lower,
coalesce, build); imports the transfer's facts only."""
