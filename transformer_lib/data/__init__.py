"""Data for training (chapters 8 and 9): a character tokenizer, synthetic sequence tasks, the
dates task with its formats, chapter 9's toy grammar, the text corpus, and batch sampling;
chapter 15's labelled speeches and prompt/response pairs; chapter 16's multiple-choice tasks;
chapter 19's associative recall.

Everything is generated offline from a seed, except Tiny Shakespeare, which is read from a local
path or downloaded once into a cache folder (see :mod:`.corpus`).
"""

from .batches import LMBatches, Seq2SeqBatches, get_batch, split_tokens
from .corpus import (
    CACHE_ENV,
    OFFLINE_ENV,
    PATH_ENV,
    SHIPPED_PATH,
    TINY_SHAKESPEARE_SHA256,
    TINY_SHAKESPEARE_URL,
    ChecksumError,
    Corpus,
    load_corpus,
    python_stdlib_corpus,
    sha256_of,
)
from .grammar import (
    TOY_GRAMMAR,
    Choice,
    generate_from_grammar,
    grammar_count,
    grammar_entropy,
    grammar_regex,
    grammar_text,
)
from .instructions import PROMPT_END, InstructionBatches, date_pairs, encode_pair, read_pairs, write_pairs
from .mc_tasks import MCItem, cloze_task, held_out_text, speaker_choice_task, write_lm_eval_task
from .recall import RecallBatch, recall_accuracy, recall_batch, recall_vocab_size
from .repeats import repeat_batch
from .speeches import LabelledTexts, Speech, encode_texts, speaker_task, split_speeches, word_order_task
from .tasks import (
    DATE_FIRST,
    DATE_FORMATS,
    DATE_LAST,
    DATE_PIECES,
    ISO_FIELDS,
    Seq2SeqData,
    date_field_shares,
    date_field_spans,
    date_format_of,
    dates_task,
    render_date,
    sequence_task,
)
from .tokenizer import (
    SPECIALS,
    TOKENIZER_FORMAT,
    CharTokenizer,
    load_tokenizer,
    pad_sequences,
    save_tokenizer,
    tokenizer_checksum,
    tokenizer_from_dict,
)

__all__ = [
    "PROMPT_END",
    "InstructionBatches",
    "LabelledTexts",
    "Speech",
    "date_pairs",
    "encode_pair",
    "encode_texts",
    "read_pairs",
    "speaker_task",
    "split_speeches",
    "word_order_task",
    "write_pairs",
    "MCItem",
    "cloze_task",
    "held_out_text",
    "speaker_choice_task",
    "write_lm_eval_task",
    "CACHE_ENV",
    "TOY_GRAMMAR",
    "Choice",
    "generate_from_grammar",
    "grammar_count",
    "grammar_entropy",
    "grammar_regex",
    "grammar_text",
    "DATE_FIRST",
    "DATE_FORMATS",
    "DATE_LAST",
    "DATE_PIECES",
    "ISO_FIELDS",
    "OFFLINE_ENV",
    "PATH_ENV",
    "SHIPPED_PATH",
    "SPECIALS",
    "TINY_SHAKESPEARE_SHA256",
    "TINY_SHAKESPEARE_URL",
    "CharTokenizer",
    "ChecksumError",
    "Corpus",
    "LMBatches",
    "Seq2SeqBatches",
    "Seq2SeqData",
    "date_field_shares",
    "date_field_spans",
    "date_format_of",
    "dates_task",
    "get_batch",
    "load_corpus",
    "pad_sequences",
    "python_stdlib_corpus",
    "render_date",
    "repeat_batch",
    "RecallBatch",
    "recall_accuracy",
    "recall_batch",
    "recall_vocab_size",
    "sequence_task",
    "sha256_of",
    "split_tokens",
    "TOKENIZER_FORMAT",
    "load_tokenizer",
    "save_tokenizer",
    "tokenizer_checksum",
    "tokenizer_from_dict",
]
