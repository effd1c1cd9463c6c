"""guard."""
