"""Goodput: how much of a run's wall time became training kept in the final model, and where the rest went.

``parts`` names the account's parts and holds the account; ``account`` is the pure computation
(records in, an account out); ``load`` reads a run directory into it; ``advice`` weighs the
checkpoint interval against the interruptions seen; ``text`` says it in a line or a table.
See docs/goodput.md.
"""
