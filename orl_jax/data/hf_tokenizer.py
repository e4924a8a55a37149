"""A Hugging Face `tokenizer.json` behind our tokenizer interface (docs/models.md#real-tasks).

Interface shared with the tiny task's `WordTokenizer`: `encode(text) -> list[int]`,
`decode(ids, stop_at_eos=...)`, `vocab_size`, `pad_id`, `mask_id`, `eos_id`, `bos_id`,
`vocab_hash()`. Special tokens are named in the config (`model.special_tokens`, a token string or
an id each) and resolved against the file, so a wrong name stops at start-up. Chat templates live
in `data/prompts.py`; prompts already contain the template's special tokens as text, so `encode`
adds none.

`byte_level_tokenizer()` builds a 260-token byte-level tokenizer in memory (no file, no
download): the debug configs use it to run real-task prompts (GSM8K) through tiny random models.
"""
from __future__ import annotations

import hashlib
import json
import os
from typing import Sequence

from tokenizers import Tokenizer, decoders, models, pre_tokenizers

SPECIAL_ROLES = ("mask", "eos", "pad", "bos")


class TokenizerError(ValueError):
  """A tokenizer that does not fit the configured model; the message names file and field."""


class HFTokenizer:
  """Wraps a `tokenizers.Tokenizer`.

  Args:
    tokenizer: the loaded tokenizer.
    special: {role: token string, or id (int or digit string)} for roles mask, eos, pad
      (default: eos) and bos (optional); "" leaves a role unset. `eos` may be a list (every id
      ends a response; `eos_id` is the first).
    source: where it came from (for error messages).
    origins: {role: where its value came from} (for the run's log; see `origins_text`).
    require_mask: a mask token must be set (False for uniform-noise families).
  """

  def __init__(self, tokenizer: Tokenizer, special: dict, source: str = "tokenizer",
               origins: dict | None = None, require_mask: bool = True):
    self._tok = tokenizer
    self.source = source
    self.origins = dict(origins or {})
    ids = {}
    for role in SPECIAL_ROLES:
      value = special.get(role)
      if value is None or value == "" or value == -1:
        continue
      values = value if isinstance(value, (list, tuple)) else [value]
      ids[role] = tuple(self._resolve(role, v) for v in values)
    for role in ("mask", "eos") if require_mask else ("eos",):
      if role not in ids:
        raise TokenizerError(f"{source}: no {role} token configured (model.special_tokens.{role})")
    ids.setdefault("pad", ids["eos"][:1])
    self._ids = ids

  def _resolve(self, role, value) -> int:
    if isinstance(value, str) and value.isdigit():   # an id written as a string in a config
      value = int(value)
    if isinstance(value, int):
      if not 0 <= value < self.vocab_size:
        origin = self.origins.get(role, f"model.special_tokens.{role}")
        raise TokenizerError(f"{self.source}: the {role} token id {value} (from {origin}) is "
                             f"outside the tokenizer's {self.vocab_size} ids: set "
                             f"model.special_tokens.{role} to a token of this tokenizer")
      return value
    token_id = self._tok.token_to_id(value)
    if token_id is None:
      origin = self.origins.get(role, f"model.special_tokens.{role}")
      raise TokenizerError(f"{self.source}: the {role} token {value!r} (from {origin}) is not a "
                           f"token of this tokenizer: set model.special_tokens.{role} to one")
    return token_id

  def origins_text(self) -> str:
    """'mask=159 (config.json), eos=157 (generation_config.json), ...': each id and where it
    came from."""
    parts = []
    for role in SPECIAL_ROLES:
      if role in self._ids:
        ids = self._ids[role]
        shown = str(ids[0]) if len(ids) == 1 else str(list(ids))
        parts.append(f"{role}={shown} ({self.origins.get(role, 'the tokenizer')})")
    return ", ".join(parts)

  @classmethod
  def from_file(cls, path: str, special: dict, origins: dict | None = None,
                require_mask: bool = True) -> "HFTokenizer":
    if os.path.isdir(path):
      path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
      raise TokenizerError(f"{path} not found: the model directory must contain tokenizer.json "
                           "(or set model.tokenizer to a tokenizer.json file)")
    try:
      tokenizer = Tokenizer.from_file(path)
    except Exception as e:  # the tokenizers library raises a bare Exception
      raise TokenizerError(f"{path} is not a readable tokenizer.json ({e}): the file is truncated "
                           "or not a Hugging Face tokenizer, so copy it again from the model "
                           "directory") from None
    return cls(tokenizer, special, source=path, origins=origins, require_mask=require_mask)

  @property
  def vocab_size(self) -> int:
    return self._tok.get_vocab_size(with_added_tokens=True)

  @property
  def mask_id(self) -> int | None:
    return self._ids["mask"][0] if "mask" in self._ids else None

  @property
  def eos_id(self) -> int:
    return self._ids["eos"][0]

  @property
  def eos_ids(self) -> tuple[int, ...]:
    """Every id that ends a response (generation_config.json may list several)."""
    return self._ids["eos"]

  @property
  def pad_id(self) -> int:
    return self._ids["pad"][0]

  @property
  def bos_id(self) -> int | None:
    return self._ids["bos"][0] if "bos" in self._ids else None

  @property
  def backend(self) -> Tokenizer:
    return self._tok

  def vocab_hash(self) -> str:
    items = sorted(self._tok.get_vocab(with_added_tokens=True).items(), key=lambda kv: kv[1])
    ids = {role: v[0] if len(v) == 1 else list(v) for role, v in self._ids.items()}
    data = json.dumps([items, sorted(ids.items())], ensure_ascii=False)
    return hashlib.sha256(data.encode()).hexdigest()[:16]

  def encode(self, text: str, *, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    if add_bos and self.bos_id is not None:
      ids = [self.bos_id] + ids
    return ids + ([self.eos_id] if add_eos else [])

  def decode(self, ids: Sequence[int], *, skip_special: bool = True,
             stop_at_eos: bool = False) -> str:
    ids = [int(i) for i in ids]
    if stop_at_eos and self.eos_id in ids:
      ids = ids[:ids.index(self.eos_id)]
    if skip_special:
      ids = [i for i in ids if i != self.mask_id]
    return self._tok.decode(ids, skip_special_tokens=skip_special)


def check_model_vocab(tokenizer, vocab_size: int, mask_id: int, where: str = "") -> None:
  """Raises TokenizerError, naming the tokenizer and the model side (`where`: the file that
  sets the model's vocabulary, e.g. a config.json; default the model.vocab_size field), unless
  every token id fits the model's embedding rows and the mask ids agree."""
  model = "the model's vocabulary"
  problems = []
  if tokenizer.vocab_size > vocab_size:
    problems.append(f"the tokenizer has {tokenizer.vocab_size} tokens but {model} has "
                    f"{vocab_size} embedding rows")
  for role in ("mask_id", "eos_id", "pad_id", "bos_id"):
    value = getattr(tokenizer, role, None)
    if value is not None and not 0 <= value < vocab_size:
      problems.append(f"the tokenizer's {role}={value} is outside {model}'s {vocab_size} rows")
  if tokenizer.mask_id != mask_id:
    problems.append(f"the tokenizer's mask_id={tokenizer.mask_id} but {model} uses "
                    f"mask_id={mask_id}")
  if problems:
    raise TokenizerError(f"{getattr(tokenizer, 'source', 'tokenizer')} does not fit "
                         f"{where or 'the model (model.vocab_size)'}: " + "; ".join(problems)
                         + " (use the tokenizer the model was trained with)")


BYTE_SPECIALS = ("<|pad|>", "<|mask|>", "<|eos|>", "<|bos|>")


def byte_level_tokenizer() -> HFTokenizer:
  """256 byte tokens (GPT-2 byte alphabet) + pad, mask, eos, bos: encodes any text, no merges."""
  alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
  vocab = {tok: i for i, tok in enumerate(list(BYTE_SPECIALS) + alphabet)}
  tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
  tok.decoder = decoders.ByteLevel()
  tok.add_special_tokens(list(BYTE_SPECIALS))
  return HFTokenizer(tok, {"pad": "<|pad|>", "mask": "<|mask|>", "eos": "<|eos|>",
                           "bos": "<|bos|>"}, source="byte-level debug tokenizer")


# ------------------------------------------------------------------ files beside an export

# tokenizer files a Hugging Face model directory may hold besides tokenizer.json; an export
# copies those of the directory the run started from
TOKENIZER_SIDE_FILES = ("chat_template.jinja", "vocab.json", "merges.txt", "tokenizer.model",
                        "added_tokens.json")
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"


def token_strings(tokenizer) -> dict[str, str]:
  """{'mask_token': '<|mask|>', 'eos_token': ..., 'pad_token': ..., 'bos_token': ...}: the
  text of each special token the tokenizer has, under transformers' names."""
  if hasattr(tokenizer, "backend"):
    text = tokenizer.backend.id_to_token
  else:
    text = lambda i: tokenizer.vocab[i]
  out = {}
  for role in SPECIAL_ROLES:
    token_id = getattr(tokenizer, f"{role}_id", None)
    if token_id is not None:
      out[f"{role}_token"] = text(token_id)
  if hasattr(tokenizer, "unk_id"):
    out["unk_token"] = text(tokenizer.unk_id)
  return out


def word_level_tokenizer(words: Sequence[str], unk: str) -> Tokenizer:
  """A `tokenizers` word-level tokenizer over `words` (id = position) that splits on whitespace
  and every digit, as the tiny task's `WordTokenizer` encodes. It decodes word by word, so a
  number's digits come back separated (`1 2`); this project decodes such a file with the
  tiny task's own tokenizer (`tasks.get_task`)."""
  tok = Tokenizer(models.WordLevel(vocab={w: i for i, w in enumerate(words)}, unk_token=unk))
  tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                               pre_tokenizers.Digits(individual_digits=True)])
  return tok


def tokenizer_json(tokenizer) -> str:
  """The tokenizer.json text of any of the project's tokenizers (a Hugging Face one as loaded;
  the tiny task's word tokenizer as `word_level_tokenizer`)."""
  if hasattr(tokenizer, "backend"):
    return tokenizer.backend.to_str(pretty=True)
  words = list(tokenizer.vocab)
  tok = word_level_tokenizer(words, words[tokenizer.unk_id])
  tok.add_special_tokens([words[i] for i in sorted({tokenizer.pad_id, tokenizer.mask_id,
                                                     tokenizer.eos_id, tokenizer.bos_id,
                                                     tokenizer.unk_id})])
  return tok.to_str(pretty=True)


def same_vocabulary(tokenizer, words: Sequence[str]) -> bool:
  """Whether a Hugging Face tokenizer's ids are exactly `words` (id = position)."""
  backend = tokenizer.backend
  return (tokenizer.vocab_size == len(words)
          and all(backend.id_to_token(i) == w for i, w in enumerate(words)))


def tokenizer_configs(tokenizer, source: dict | None) -> dict[str, str]:
  """{file name: text} of tokenizer_config.json and special_tokens_map.json for an export,
  naming the run's special tokens as transformers reads them: the source directory's
  tokenizer_config.json (`source`, its chat template and settings kept) with the tokens set,
  or a `PreTrainedTokenizerFast` one."""
  tokens = token_strings(tokenizer)
  config = dict(source or {"tokenizer_class": "PreTrainedTokenizerFast",
                           "clean_up_tokenization_spaces": False})
  config.update(tokens)
  return {TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False),
          SPECIAL_TOKENS_MAP_FILE: json.dumps(tokens, indent=2, ensure_ascii=False)}
