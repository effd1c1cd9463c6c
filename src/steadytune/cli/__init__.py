"""Command-line front-end: one module per subcommand.

Each module in this package that defines ``register(subparsers)`` becomes a
subcommand; ``register`` adds its parser and sets ``func`` to a ``(args) -> int``.
"""
