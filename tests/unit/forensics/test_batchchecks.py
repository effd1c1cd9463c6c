"""Each per-sample and per-batch check, on hand-made token lists."""

from __future__ import annotations

from steadytune.forensics.batchchecks import (
    SampleFacts,
    check_batch,
    check_sample,
    level_of,
    longest_run,
    token_stats,
    trained_positions,
)

SPECIAL = frozenset({0, 1, 2})


def facts(ids, labels=None, **kw):
    return SampleFacts(
        input_ids=ids,
        labels=ids if labels is None else labels,
        vocab_size=100,
        special_ids=SPECIAL,
        pad_id=0,
        unk_id=3,
        **kw,
    )


def checks(f):
    return [x.check for x in check_sample(f)[0]]


def test_healthy_sample_has_no_findings():
    found, stats = check_sample(facts([1, 10, 11, 12, 13, 2]))
    assert found == [] and level_of(found) == "ok"
    assert stats.tokens == 6 and stats.trained == 5 and stats.special == 2


def test_all_labels_masked_is_critical_and_names_truncation():
    f = facts([1, 10, 11, 12, 13], [-100] * 5, untruncated_len=40, max_seq_length=5)
    found, _ = check_sample(f)
    assert [x.check for x in found] == ["all_labels_masked", "truncated"]
    assert "cut off by truncation" in found[0].message and level_of(found) == "bad"


def test_first_label_alone_is_not_trained():
    # labels shift by one: a label only at position 0 never reaches the loss
    assert trained_positions([5, -100, -100]) == 0
    assert "all_labels_masked" in checks(facts([1, 10, 11], [5, -100, -100]))


def test_empty_and_padding_inputs():
    assert checks(facts([])) == ["empty_input"]
    assert "empty_input" in checks(facts([1, 2]))
    assert "all_padding" in checks(facts([0, 0, 0], [-100, -100, -100]))


def test_empty_answer_is_a_warning():
    found, _ = check_sample(facts([1, 10, 11, 12, 13, 2], [-100, -100, -100, -100, -100, 2]))
    assert [x.check for x in found] == ["empty_target"] and level_of(found) == "suspect"


def test_ids_outside_the_vocabulary():
    assert "label_out_of_vocab" in checks(facts([1, 10, 11], [-100, 10, 250]))
    assert "input_out_of_vocab" in checks(facts([1, 10, 500]))


def test_non_finite_float_inputs():
    assert "nonfinite_input" in checks(facts([1, 10, 11, 12], raw_floats=(0.5, float("nan"))))


def test_very_short_sample_is_a_warning():
    assert checks(facts([1, 10, 11, 2])) == ["too_short"]


def test_floods_of_special_and_repeated_tokens():
    assert "special_flood" in checks(facts([1] + [2] * 20 + [10]))
    assert "repeat_flood" in checks(facts([1] + [42] * 40 + [2]))
    assert longest_run([1, 5, 5, 5, 2]) == 3


def test_encoding_problems():
    assert "encoding_error" in checks(facts([1, 10, 3, 11]))  # an unknown token
    assert "encoding_error" in checks(facts([1, 10, 11], raw_texts=("caf\ufffd",)))
    assert "encoding_error" in checks(facts([1, 10, 11], raw_texts=("bell \x07",)))


def test_hash_mismatch_means_the_dataset_changed():
    found, _ = check_sample(facts([1, 10, 11, 12, 13], recorded_hash="aaa", current_hash="bbb"))
    assert found[0].check == "hash_mismatch" and found[0].level == "critical"
    assert checks(facts([1, 10, 11, 12, 13], recorded_hash="aaa", current_hash="aaa")) == []


def test_batch_with_no_trained_token_and_length_outlier():
    masked = token_stats(facts([1, 10, 11], [-100] * 3))
    assert [f.check for f in check_batch([masked, masked])] == ["batch_no_trained_tokens"]
    short = token_stats(facts([1, 10, 11, 2]))
    long = token_stats(facts([1] + [10, 11] * 30 + [2]))
    assert [f.check for f in check_batch([short, short, long])] == ["length_outlier"]
