"""Word-level tokenizer over the tiny task's fixed lexicon
(docs/method.md#the-embedded-default-a-tiny-verifiable-task).

Text convention: words are separated by single spaces and numbers are written as ordinary decimal
words (`7 + 5 = 12 .`). Every digit is its own token, so `12` encodes as the tokens `1`, `2`, and
`decode` joins a run of adjacent digit tokens back into one number. The tiny task's grammar never
puts two numbers next to each other, so `decode(encode(text)) == text` for every generated text.

Vocabulary layout (fixed, so a checkpoint's vocabulary never changes across runs): the special
tokens first, in `SPECIAL_TOKENS` order (`<pad>` is 0), then the lexicon sorted as strings.
"""
from __future__ import annotations

import hashlib
from typing import Iterable, Sequence

PAD, MASK, EOS, BOS, UNK = "<pad>", "<mask>", "<eos>", "<bos>", "<unk>"
SPECIAL_TOKENS = (PAD, MASK, EOS, BOS, UNK)
DIGITS = tuple("0123456789")


class UnknownWordError(ValueError):
  """A word outside the lexicon (`word`): callers that cannot pass `allow_unknown` (a server's
  client) name the lexicon instead (`WordTokenizer.lexicon`)."""

  def __init__(self, message: str, word: str):
    super().__init__(message)
    self.word = word


def pretokenize(text: str) -> list[str]:
  """Splits `text` on whitespace, then splits every number into its digits."""
  words: list[str] = []
  for word in text.split():
    if word.isdigit():
      words.extend(word)
    else:
      words.append(word)
  return words


class WordTokenizer:
  """Maps whitespace-separated words to ids; digits are single tokens.

  Args:
    lexicon: the non-special words; digits 0-9 are always included. Order is irrelevant: the
      vocabulary is `SPECIAL_TOKENS` followed by the sorted lexicon.
  """

  def __init__(self, lexicon: Iterable[str]):
    words = set(lexicon) | set(DIGITS)
    clashes = words & set(SPECIAL_TOKENS)
    if clashes:
      raise ValueError(f"Lexicon words {sorted(clashes)} collide with the special tokens.")
    bad = sorted(w for w in words if not w or any(c.isspace() for c in w)
                 or (w.isdigit() and len(w) > 1))
    if bad:
      raise ValueError(f"Lexicon words {bad} are empty, contain whitespace or are multi-digit "
                       "numbers (numbers are spelled with the digit tokens).")
    self._vocab: tuple[str, ...] = SPECIAL_TOKENS + tuple(sorted(words))
    self._ids = {word: i for i, word in enumerate(self._vocab)}
    self._special_ids = frozenset(self._ids[t] for t in SPECIAL_TOKENS)

  @property
  def vocab(self) -> tuple[str, ...]:
    return self._vocab

  @property
  def lexicon(self) -> tuple[str, ...]:
    """The words a text may use besides numbers (the vocabulary without the special tokens and
    the digits), sorted."""
    return tuple(w for w in self._vocab if w not in SPECIAL_TOKENS and w not in DIGITS)

  @property
  def vocab_size(self) -> int:
    return len(self._vocab)

  @property
  def pad_id(self) -> int:
    return self._ids[PAD]

  @property
  def mask_id(self) -> int:
    return self._ids[MASK]

  @property
  def eos_id(self) -> int:
    return self._ids[EOS]

  @property
  def bos_id(self) -> int:
    return self._ids[BOS]

  @property
  def unk_id(self) -> int:
    return self._ids[UNK]

  def vocab_hash(self) -> str:
    """A short fingerprint of the vocabulary; store it with a checkpoint and compare on load."""
    return hashlib.sha256("\n".join(self._vocab).encode()).hexdigest()[:16]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False,
             allow_unknown: bool = False) -> list[int]:
    """Encodes `text` to ids.

    Args:
      text: whitespace-separated words; numbers may be written whole (`27`).
      add_bos: prepend `<bos>`.
      add_eos: append `<eos>`.
      allow_unknown: map words outside the lexicon to `<unk>` instead of raising.

    Returns:
      The token ids.

    Raises:
      UnknownWordError: a word is outside the lexicon and `allow_unknown` is False.
    """
    ids = [self.bos_id] if add_bos else []
    for word in pretokenize(text):
      token_id = self._ids.get(word)
      if token_id is None:
        if not allow_unknown:
          raise UnknownWordError(
              f"Word {word!r} is not in the tiny-task lexicon (in {text!r}); extend the "
              "grammar's lexicon or pass allow_unknown=True to map it to <unk>.", word)
        token_id = self.unk_id
      ids.append(token_id)
    if add_eos:
      ids.append(self.eos_id)
    return ids

  def decode(self, ids: Sequence[int], *, skip_special: bool = True,
             stop_at_eos: bool = False) -> str:
    """Decodes ids to text, joining adjacent digit tokens into one number.

    Args:
      ids: token ids (ints or a 1-D integer array).
      skip_special: drop special tokens from the text. A dropped token still ends a digit run, so
        `2 <mask> 7` decodes as `2 7`, never as `27`.
      stop_at_eos: ignore everything from the first `<eos>` on.

    Returns:
      Space-separated words.
    """
    words: list[str] = []
    previous_was_digit = False
    for token_id in ids:
      token_id = int(token_id)
      if stop_at_eos and token_id == self.eos_id:
        break
      if not 0 <= token_id < len(self._vocab):
        raise ValueError(f"Token id {token_id} is outside the vocabulary of size "
                         f"{len(self._vocab)}; the model and tokenizer do not match.")
      word = self._vocab[token_id]
      is_digit = word in DIGITS
      if is_digit and previous_was_digit:
        words[-1] += word
      elif not (skip_special and token_id in self._special_ids):
        words.append(word)
      previous_was_digit = is_digit
    return " ".join(words)


def token_text(tokenizer, token: int) -> str:
  """What one token of any of the project's tokenizers (`WordTokenizer`,
  `hf_tokenizer.HFTokenizer`) reads as on its own: its decoded text, or, where that is not whole
  characters (a byte-level tokenizer's piece of a character), its bytes as \\xNN; a line break
  as the return sign."""
  text = tokenizer.decode([int(token)], skip_special=False)
  if "\ufffd" in text:
    piece = getattr(getattr(tokenizer, "backend", None), "id_to_token", lambda t: None)(int(token))
    text = piece if piece and "\ufffd" not in piece else f"<{int(token)}>"
  return text.replace("\n", "\u23ce")
