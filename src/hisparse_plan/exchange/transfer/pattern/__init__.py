"""The pattern proved once per pair and instantiated per request, the staged pattern and
the cost model that picks; imports the transfer's facts, program and proof.

Each request-level module (instance, staged_request) reads its pattern through a
Protocol, so the pattern modules import them and never the other way."""
