"""The one redaction: configs, command lines, URLs and texts, by the same rules."""

from __future__ import annotations

import pytest

from steadytune.redact import MASK, Redactor, is_secret_key, redact, redact_argv, redact_text

TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWx"  # Hugging Face's shape, built so no scanner trips on it


@pytest.mark.parametrize(
    "key", ["hub_token", "HF_TOKEN", "--hub-token", "hubToken", "password", "db.password", "api_key",
            "WANDB_API_KEY", "apikey", "client_secret", "webhook_url", "aws_secret_access_key", "auth",
            "use_auth_token", "credentials"],
)  # fmt: skip
def test_keys_that_name_a_secret(key: str) -> None:
    assert is_secret_key(key)


@pytest.mark.parametrize(
    "key", ["max_tokens", "tokenizer", "tokenizer_name", "num_tokens", "author", "password_env", "token_file",
            "url_env", "learning_rate", "output_dir", "monkey", "keyboard", ""],
)  # fmt: skip
def test_keys_that_do_not(key: str) -> None:
    assert not is_secret_key(key)


def test_a_command_line_keeps_its_shape_and_loses_its_secrets() -> None:
    argv = ["trl", "sft", "--hub_token", TOKEN, "--password=hunter22", "--lr", "1e-4", "HF_TOKEN=abc123",
            "--push_to_hub_token", "--max_new_tokens", "5", "https://u:pw@hub.example.com/m", "--auth",
            "-x"]  # fmt: skip
    assert redact_argv(argv) == [
        "trl", "sft", "--hub_token", MASK, f"--password={MASK}", "--lr", "1e-4", f"HF_TOKEN={MASK}",
        "--push_to_hub_token", "--max_new_tokens", "5", f"https://{MASK}@hub.example.com/m", "--auth", "-x",
    ]  # fmt: skip
    assert redact(argv) == redact_argv(argv)  # a list of strings is a command line


def test_the_same_rules_in_text_joined_from_a_command_line() -> None:
    text = f"supervising trl sft --hub_token {TOKEN} --password 'two words' --lr 1e-4 https://u:pw@h/x?token=abc&n=1"
    assert redact_text(text) == (
        f"supervising trl sft --hub_token {MASK} --password {MASK} --lr 1e-4 https://{MASK}@h/x?token={MASK}&n=1"
    )
    assert TOKEN not in redact_text(f"a token {TOKEN} in prose") and "Bearer abcdefghijklmnopqrstu" not in (
        redact_text("Authorization: Bearer abcdefghijklmnopqrstu")
    )


def test_ordinary_run_messages_pass_unchanged() -> None:
    for text in (
        "loss_spike at step 120: loss 4.2 is 6.1 sigma above its window (max_tokens=512)",
        "checkpoint-40 saved to /runs/r1/checkpoints/checkpoint-40 (tokenizer: gpt2)",
        "stop requested by alice (dashboard, 127.0.0.1)",
        "https://hub.example.com/org/model",
    ):
        assert redact_text(text) == text


def test_a_config_masks_secret_keys_whole_and_keeps_where_they_live() -> None:
    smtp = {"password": "p", "password_env": "SMTP"}
    cfg = {"alerts": {"webhook_url": "https://hooks.example/x", "smtp": smtp},
           "model": {"name_or_path": "gpt2"}, "args": ["--hub_token", "abc"], "empty_token": ""}  # fmt: skip
    assert redact(cfg) == {
        "alerts": {"webhook_url": MASK, "smtp": {"password": MASK, "password_env": "SMTP"}},
        "model": {"name_or_path": "gpt2"},
        "args": ["--hub_token", MASK],
        "empty_token": "",
    }


def test_a_redactor_adds_the_values_it_was_told_to_the_rules() -> None:
    r = Redactor()
    r.add("plain-secret-value")
    assert r.redact(f"sent plain-secret-value with {TOKEN}") == f"sent {MASK} with {MASK}"
    assert r.redact_obj({"x": ["--hub_token", "t"], "password": "p"}) == {
        "x": ["--hub_token", MASK],
        "password": MASK,
    }


@pytest.mark.parametrize("word", ["x", "a1", "ab-cd."])
def test_a_long_line_without_spaces_is_redacted_in_linear_time(word: str) -> None:
    # Every log line, stderr tail and event passes here. A 100 kB word (base64, a minified JSON) was
    # scanned to its end from each of its positions: minutes of one CPU, quadratic in its length.
    import time

    line = word * (200_000 // len(word))
    started = time.monotonic()
    assert (
        redact_text(f"{line} password={line} https://u:p@{line}/x")
        == f"{line} password={MASK} https://{MASK}@{line}/x"
    )
    assert time.monotonic() - started < 10  # about 0.1 s; the quadratic scan took hours here
