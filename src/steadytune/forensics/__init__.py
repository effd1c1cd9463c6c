"""forensics."""
