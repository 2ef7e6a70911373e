"""The chat template an instruction run's exported tokenizer carries (chapter "Fine-tuning"): transformers'
``apply_chat_template`` writes a user's message exactly as the book writes a prompt
(``prompt + PROMPT_END``) and a conversation as the book's fine-tuning rows; an exported
instruction run carries it, a pretraining run none."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import transformer_lib as tl
from tests.test_cli import offline_one_thread  # noqa: F401 (autouse: offline, one thread)
from tests.test_export import runs  # noqa: F401 (the module's trained runs)
from transformer_lib.data import CharTokenizer
from transformer_lib.data.instructions import PROMPT_END
from transformer_lib.export import hf_tokenizer, instruction_chat_template

transformers = pytest.importorskip("transformers")
jinja2 = pytest.importorskip("jinja2")

TOKENIZER = CharTokenizer.from_text("abc =>\n'\"{}%#\\é", specials=["<eos>"])
HF = hf_tokenizer(TOKENIZER, chat_template=instruction_chat_template())
TEXT = st.text(alphabet="abc =>\n'\"{}%#\\é", max_size=30)


def chat(messages, generation=True):
    return HF.apply_chat_template(messages, add_generation_prompt=generation, tokenize=False)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(question=TEXT)
def test_a_users_message_is_the_books_prompt(question):
    assert chat([{"role": "user", "content": question}]) == question + PROMPT_END
    ids = HF.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True, tokenize=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert list(ids) == TOKENIZER.encode(question + PROMPT_END)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(pairs=st.lists(st.tuples(TEXT, TEXT), min_size=1, max_size=3))
def test_a_conversation_is_the_books_rows_one_after_another(pairs):
    messages = [m for p, r in pairs for m in ({"role": "user", "content": p}, {"role": "assistant", "content": r})]
    assert chat(messages, generation=False) == "".join(p + PROMPT_END + r + "<eos>" for p, r in pairs)


def test_another_role_is_refused_by_name():
    with pytest.raises(jinja2.TemplateError, match="not system"):
        chat([{"role": "system", "content": "be brief"}, {"role": "user", "content": "a"}])


def test_an_exported_instruction_run_carries_the_template_and_a_pretraining_run_none(runs, tmp_path):  # noqa: F811
    tl.export_hf(runs / "gpt2-bpe-lora", tmp_path / "tuned", merge_adapter=True)
    tl.export_hf(runs / "gpt2-bpe", tmp_path / "base")
    _, tokenizer, _ = tl.load_run(runs / "gpt2-bpe-lora")
    tuned = transformers.AutoTokenizer.from_pretrained(tmp_path / "tuned")
    question = "ROMEO: what light?"
    text = tuned.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    assert text == question + PROMPT_END and tuned(text)["input_ids"] == tokenizer.encode(question + PROMPT_END)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "base").chat_template is None
