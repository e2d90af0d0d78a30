"""GSM8K answer extraction and the shaped reward."""

import json
from pathlib import Path

import pytest

from assignment.trainer.config import RewardConfig
from assignment.trainer.reward import extract_answer, find_answer, normalize_number, reasoning_words, score

# Answer fields as they appear in OpenAI's GSM8K train/test files.
REAL_ANSWERS = [
    ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72", "72"),
    ("Weng earns 12/60 = $<<12/60=0.2>>0.2 per minute.\nWorking 50 minutes, she earned 0.2 x 50 = $<<0.2*50=10>>10.\n#### 10", "10"),
    ("The total cost is 40*1000 = $<<40*1000=40000>>40,000\n#### 40,000", "40000"),
    ("He lost 3 - 13 = <<3-13=-10>>-10 pounds.\n#### -10", "-10"),
]


@pytest.mark.parametrize("text, expected", REAL_ANSWERS)
def test_extracts_real_gsm8k_answers(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("#### 1,000", "1000"), ("#### $1,000", "1000"), ("#### $ 7", "7"), ("####72", "72"),
    ("#### 3.50", "3.5"), ("#### 1000.00", "1000"), ("#### -0.25", "-0.25"), ("#### 007", "7"),
    ("so 5 apples\n#### 12\nand\n#### 13", "13"),  # the last marker counts
    ("The answer is 72.", None), ("#### seventy", None), ("", None),
    ("#### 5.", "5"),  # a sentence's full stop is not a decimal point
])
def test_extract_answer_formats(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("text, expected", [
    ("so the answer is \\boxed{18}.", "18"),
    ("\\boxed{1,000}", "1000"), ("\\boxed{$18}", "18"), ("\\boxed{\\$18}", "18"), ("\\boxed{ 3.50 }", "3.5"),
    ("\\boxed{-7}", "-7"), ("$\\boxed{72}$", "72"), ("\\[ \\boxed{5} \\]", "5"),
    ("\\boxed{\\frac{1}{2}}", None),  # nested braces: not a number, no answer
    ("\\boxed{18\\%}", None), ("\\boxed{18 \\text{ dollars}}", None), ("\\boxed{x}", None), ("\\boxed{}", None),
    ("#### 5\nso \\boxed{7}", "7"), ("\\boxed{7}\n#### 5", "5"),  # whichever comes last
    ("\\boxed{3} then \\boxed{4}", "4"),
    ("#### 5 then \\boxed{\\frac{1}{2}}", "5"),  # a malformed marker is skipped, as '#### seventy' is
])
def test_last_of_both_reads_boxed_and_hashes(text, expected):
    assert extract_answer(text, "last_of_both") == expected
    assert extract_answer(text) == expected  # the default


@pytest.mark.parametrize("text, expected", [("\\boxed{18}", None), ("#### 5\nso \\boxed{7}", "5"), ("#### 1,000", "1000")])
def test_strict_reads_only_hashes(text, expected):
    assert extract_answer(text, "strict") == expected


def test_find_answer_says_which_marker_and_where():
    text = "2 + 2 = 4, so \\boxed{4}"
    answer = find_answer(text)
    assert (answer.value, answer.marker, text[answer.start:]) == ("4", "boxed", "\\boxed{4}")
    assert find_answer("#### 4").marker == "####" and find_answer("no answer") is None
    with pytest.raises(ValueError, match="answer_format"):
        find_answer("#### 4", "loose")


def test_score_reads_boxed_unless_strict():
    boxed = "2 + 2 = 4, so \\boxed{4}"
    scored = score(boxed, "4", True, 12, RewardConfig(format_bonus=0.0))
    assert (scored.reward, scored.correct, scored.answer, scored.marker) == (1.0, True, "4", "boxed")
    strict = score(boxed, "4", True, 12, RewardConfig(format_bonus=0.0, answer_format="strict"))
    assert (strict.reward, strict.correct, strict.formatted, strict.answer) == (0.0, False, False, None)


def test_reasoning_words_count_before_the_boxed_answer_too():
    assert reasoning_words("one two three \\boxed{5}") == 3
    cfg = RewardConfig(format_bonus=0.2, format_bonus_when="reasoning", min_reasoning_words=3)
    assert score("\\boxed{5}", "4", True, 3, cfg).reward == 0.0
    assert score("one two three \\boxed{5}", "4", True, 9, cfg).reward == pytest.approx(0.2)


def test_normalize_number_compares_values_not_strings():
    assert normalize_number("1,000.0") == normalize_number("1000") == "1000"
    assert normalize_number("abc") is None and normalize_number("nan") is None


def test_reasoning_words_counts_only_before_the_marker():
    assert reasoning_words("a b c\n#### 5") == 3
    assert reasoning_words("#### 5") == 0
    assert reasoning_words("no marker here") == 3


CFG = RewardConfig(correct=1.0, format_bonus=0.1, format_bonus_when="always")


def test_correct_formatted_and_wrong():
    assert score("2 + 2 = 4\n#### 4", "4", True, 8, CFG).reward == pytest.approx(1.1)
    wrong = score("#### 5", "4", True, 3, CFG)
    assert wrong.reward == pytest.approx(0.1) and wrong.formatted and not wrong.correct
    unformatted = score("The answer is 4", "4", True, 5, CFG)
    assert unformatted.reward == 0.0 and not unformatted.correct  # strict: no marker, no credit


def test_format_bonus_only_after_reasoning():
    cfg = RewardConfig(format_bonus=0.2, format_bonus_when="reasoning", min_reasoning_words=5)
    assert score("#### 5", "4", True, 3, cfg).reward == 0.0  # the skip-the-reasoning shortcut pays nothing
    assert score("one two three four five\n#### 5", "4", True, 9, cfg).reward == pytest.approx(0.2)
    assert score("#### 4", "4", True, 3, cfg).reward == pytest.approx(1.0)  # correct is still correct


def test_format_bonus_only_when_correct():
    cfg = RewardConfig(format_bonus=0.2, format_bonus_when="correct")
    assert score("#### 5", "4", True, 3, cfg).reward == 0.0
    assert score("#### 4", "4", True, 3, cfg).reward == pytest.approx(1.2)


def test_truncation_and_length_terms():
    cfg = RewardConfig(format_bonus=0.0, truncation_reward=-0.5, per_token_reward=-0.01)
    assert score("#### 4", "4", False, 10, cfg).reward == pytest.approx(1.0 - 0.5 - 0.1)
    assert score("#### 4", "4", True, 10, cfg).reward == pytest.approx(1.0 - 0.1)


GSM8K_SAMPLE = Path(__file__).resolve().parent / "data" / "gsm8k"  # real GSM8K lines, see its README.md


def test_every_real_gsm8k_answer_extracts():
    for split in ("train", "test"):
        for line in (GSM8K_SAMPLE / f"{split}.jsonl").read_text().splitlines():
            record = json.loads(line)
            assert extract_answer(record["answer"]) is not None, record["answer"]
