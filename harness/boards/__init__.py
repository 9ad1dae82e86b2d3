"""Reaching a board: the local and SSH transports (one interface), its probe, its lease and labgrid places."""
