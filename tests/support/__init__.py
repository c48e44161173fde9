"""Test doubles and helpers shared by the test files; none of it ships in the wheel."""
