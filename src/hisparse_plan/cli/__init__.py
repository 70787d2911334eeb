"""The command-line interface (presentation only: it calls the public API)."""
