"""Test doubles behind the project's real seams (the scheduler's runner factory)."""
