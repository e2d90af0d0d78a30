"""Data: GSM8K jsonl checking and loading, the synthetic task, its tokenizer, the curriculum."""

import json
from pathlib import Path

import pytest

from assignment.trainer.config import DataConfig
from assignment.trainer.data import Curriculum, DataError, check_jsonl, load_problems, training_batch
from assignment.trainer.reward import extract_answer
from assignment.trainer.synthetic import build_tokenizer, make_problems

RECORD = {"question": "What is 2 + 3?", "answer": "2 + 3 = <<2+3=5>>5\n#### 5"}
GSM8K_SAMPLE = Path(__file__).resolve().parent / "data" / "gsm8k"  # real GSM8K lines, see its README.md


def write_split(folder, name, lines):
    (folder / f"{name}.jsonl").write_text("".join(line + "\n" for line in lines))


@pytest.mark.parametrize("bad, message", [
    ("{not json", "not valid JSON"),
    (json.dumps({"question": "q"}), "string fields 'question' and 'answer'"),
    (json.dumps({"question": "q", "answer": "no marker"}), "no '#### <number>' line"),
])
def test_malformed_line_is_named_by_file_and_line(tmp_path, bad, message):
    write_split(tmp_path, "train", [json.dumps(RECORD), "", bad])
    with pytest.raises(DataError, match=rf"train\.jsonl:3: .*{message}"):
        check_jsonl(tmp_path / "train.jsonl")


def test_missing_data_file(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        load_problems(DataConfig(task="gsm8k", local_dir=str(tmp_path)), seed=0)


def test_local_gsm8k_folder_loads_with_datasets(tmp_path):
    write_split(tmp_path, "train", [json.dumps(RECORD)] * 3)
    write_split(tmp_path, "test", [json.dumps({"question": "Q", "answer": "x\n#### 1,250"})])
    splits = load_problems(DataConfig(task="gsm8k", local_dir=str(tmp_path), max_train=2), seed=0)
    assert [p.answer for p in splits["train"]] == ["5", "5"]
    assert splits["test"][0].question == "Q" and splits["test"][0].answer == "1250"


def test_the_committed_gsm8k_sample_loads():
    splits = load_problems(DataConfig(task="gsm8k", local_dir=str(GSM8K_SAMPLE)), seed=0)
    assert (len(splits["train"]), len(splits["test"])) == (40, 20)
    assert splits["train"][0].answer == "72" and splits["train"][0].question.startswith("Natalia sold clips")
    assert (GSM8K_SAMPLE / "LICENSE").read_text().startswith("MIT License")


def test_synthetic_problems_are_correct_and_deterministic():
    records = make_problems(50, 9, "+-", seed=3)
    assert records == make_problems(50, 9, "+-", seed=3) and records != make_problems(50, 9, "+-", seed=4)
    for r in records:
        a, op, b = r["question"].removeprefix("What is ").removesuffix("?").split()
        assert extract_answer(r["answer"]) == str(int(a) + int(b) if op == "+" else int(a) - int(b))
        assert 0 <= int(a) <= 9 and 0 <= int(b) <= 9


def test_training_batch_is_a_function_of_seed_and_step():
    cfg = DataConfig()
    one = training_batch(cfg, [], 16, seed=0, step=5, max_operand=2)
    assert one == training_batch(cfg, [], 16, seed=0, step=5, max_operand=2)
    assert one != training_batch(cfg, [], 16, seed=0, step=6, max_operand=2)
    assert all(int(p.answer) <= 4 for p in one)


def test_synthetic_test_set_is_the_full_task():
    test = load_problems(DataConfig(max_operand=4, curriculum_start=1, synthetic_test_size=100), seed=0)["test"]
    assert len(test) == 100 and max(int(p.answer) for p in test) > 2


def test_curriculum_widens_after_a_good_window_and_saves_state():
    c = Curriculum(DataConfig(max_operand=3, curriculum_start=1, curriculum_threshold=0.8, curriculum_window=2))
    c.update(0.9)
    assert c.level == 1  # the window is not full yet
    c.update(0.5)
    c.update(0.9)
    assert c.level == 1  # mean 0.7 < 0.8
    c.update(0.95)
    assert c.level == 2
    restored = Curriculum(DataConfig(max_operand=3, curriculum_start=1))
    restored.load_state_dict(c.state_dict())
    assert restored.level == 2 and restored.recent == c.recent
    assert Curriculum(DataConfig(max_operand=3, curriculum_start=None)).level == 3  # no curriculum: the full task


def test_synthetic_tokenizer_round_trips_and_has_a_chat_template():
    tok = build_tokenizer()
    text = "3 + 4 = 7\n#### 7"
    assert tok.decode(tok(text).input_ids) == text
    assert tok.convert_ids_to_tokens(tok("####7").input_ids) == ["####", "7"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is 3 + 4?"}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt == "<|user|>What is 3 + 4?<|assistant|>"
    assert tok.pad_token_id != tok.eos_token_id and tok.padding_side == "left"
