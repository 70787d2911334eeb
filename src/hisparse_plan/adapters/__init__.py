"""Bridges between hisparse_plan and inference engines (each behind its own extra)."""
