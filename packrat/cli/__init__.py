"""The `packrat` command: one module per command; main.py wires them."""
