"""Sizing and searching: the memory model, fit, the equal-memory study and tune."""
