"""Clients that put `backends.layer.MoELayer` inside other projects' models (optional dependencies)."""
