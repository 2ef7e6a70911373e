"""transformer_lib: the library the book "Attention, Executed" builds chapter by chapter.

Modules, in chapter order: ``attention`` (scaled dot-product and additive attention),
``masks``, ``multihead``, ``positional``, ``blocks``, ``models``; plus ``viz`` for figures.
Mask convention everywhere: boolean, ``True`` means "may attend".
"""

from .attention import AdditiveAttention, masked_softmax, scaled_dot_product_attention
from .blocks import Decoder, DecoderLayer, Encoder, EncoderLayer, FeedForward
from .masks import causal_mask, combine_masks, padding_mask
from .models import GPT, GPTConfig, Transformer, TransformerConfig
from .multihead import MultiHeadAttention, head_contributions, merge_heads, multihead_cost, split_heads
from .positional import (
    LearnedPositionalEmbedding,
    RotaryEmbedding,
    SinusoidalPositionalEncoding,
    apply_rotary,
    sinusoidal_encoding,
)
from .utils import pick_device, set_seed

__version__ = "0.1.0"

__all__ = [
    "GPT",
    "AdditiveAttention",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "FeedForward",
    "GPTConfig",
    "LearnedPositionalEmbedding",
    "MultiHeadAttention",
    "RotaryEmbedding",
    "SinusoidalPositionalEncoding",
    "Transformer",
    "TransformerConfig",
    "apply_rotary",
    "causal_mask",
    "combine_masks",
    "data",
    "exercises",
    "masked_softmax",
    "head_contributions",
    "merge_heads",
    "multihead_cost",
    "padding_mask",
    "pick_device",
    "scaled_dot_product_attention",
    "set_seed",
    "sinusoidal_encoding",
    "split_heads",
    "train",
    "viz",
]

# last: the exercise checks compare against the names above
from . import exercises, viz  # noqa: E402, I001


def __getattr__(name: str):
    # data and train load on first use, so `python -m transformer_lib.train` runs the module once
    if name in ("data", "train"):
        import importlib

        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'transformer_lib' has no attribute {name!r}")
