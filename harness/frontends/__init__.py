"""Frontends under test: one driver interface, several implementations."""
