"""Test doubles (fake servers and clients) shared by the querylab test suite."""
