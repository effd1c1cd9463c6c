"""What outside input looks like, roughly: values a log, a config or a request may carry, weird ones first."""

from __future__ import annotations

from hypothesis import strategies as st

HUGE = ["9" * 400, "1e999", "-1e999", "1e-400", str(2**64), str(-(2**63)), "0x1f", "1_000", "١٢٣"]
WEIRD_TEXT = [
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "null",
    "",
    " ",
    "\x00",
    "\ufeff",
    "é",
    "𝟘",
    "\r",
    "%s",
    "{}",
]

numbers = st.one_of(
    st.integers(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from(HUGE).map(lambda s: int(s) if s.lstrip("-").isdigit() else s),
)
scalars = st.one_of(
    st.none(), st.booleans(), numbers, st.text(max_size=12), st.sampled_from(WEIRD_TEXT + HUGE)
)
json_values = st.recursive(
    scalars,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=10), kids, max_size=4),
    max_leaves=10,
)
number_text = st.one_of(
    st.sampled_from(HUGE + WEIRD_TEXT),
    numbers.map(str),
    st.text(alphabet="0123456789.eE+-_", min_size=1, max_size=12),
)
METRIC_KEYS = [
    "step",
    "loss",
    "grad_norm",
    "learning_rate",
    "lr",
    "epoch",
    "eval_loss",
    "reward",
    "kl",
    "type",
    "iteration",
    "global_step",
    "train/loss",
    "train_loss",
    "current_steps",
    "total_steps",
    "loss_scale",
    "tokens",
    "rewards/chosen",
    "entropy",
    "ts",
    "rank",
    "attempt",
]
metric_rows = st.dictionaries(st.sampled_from(METRIC_KEYS) | st.text(max_size=8), json_values, max_size=8)
