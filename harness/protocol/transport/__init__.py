"""Thin pyzmq helpers shared by mock engines and frontends: endpoints and socket options."""
