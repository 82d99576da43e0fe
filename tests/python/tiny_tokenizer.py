# SPDX-License-Identifier: Apache-2.0
"""A small byte-level BPE tokenizer built offline (the `tokenizers` package),
saved as a transformers tokenizer folder with a given chat template; for the
tests of hsflow.data."""

SPECIALS = ["<unk>", "<s>", "<|im_start|>", "<|im_end|>", "<|start|>", "<|sep|>", "<|eot|>"]

CORPUS = [
    "hello world how are you today", "I am fine thank you very much",
    "the weather is nice and the sun is out", "call the tool get_weather for Paris",
    "result: sunny, 21 degrees", "you are a helpful assistant", "multi turn chat works",
    "héllo ✓ naïve café",
]

# ChatML with {% generation %} around each reply and its end-of-turn marker (not
# the newline after it, as the common twins mark)
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}<|im_end|>"
    "{% endgeneration %}{{ '\\n' }}{% else %}{{ m['content'] }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def train_bpe(vocab_size=400, extra_specials=()):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS * 10, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS + list(extra_specials),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return tok


def save_tokenizer(tok, folder, template):
    """Saves `tok` with `template` as a transformers tokenizer folder."""
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                   eos_token="<|im_end|>")
    fast.chat_template = template
    fast.save_pretrained(str(folder))
    return str(folder)
