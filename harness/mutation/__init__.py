"""Mutation testing of the reference frontend with mutmut (`make mutation`, docs/mutation.md)."""
