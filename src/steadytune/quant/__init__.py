"""``quant-check``: what quantizing the base model costs on the user's own eval data.

``figures`` (the arithmetic and the verdict) and ``report`` are torch-free; ``tokens`` and
``measure`` need torch and are imported only when a check really runs.
"""
