"""Test support: a scripted model server for the real agent CLIs, and its helpers."""
