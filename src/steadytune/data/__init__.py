"""The dataset's rows and their tokens, torch-free: one reader, one encoder, one sample hash.

The worker builds its training set from these, and the supervisor's inspect-batch
re-reads and re-encodes the same rows with them, so a hash recorded while training is
checked against a hash made by the same code. Nothing here imports torch or ``datasets``.
"""
