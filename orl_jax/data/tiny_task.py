"""The tiny task: procedural arithmetic word problems with chain-of-thought answers
(docs/method.md#the-embedded-default-a-tiny-verifiable-task).

A problem names a person and an object, states a starting count and 2-3 operations (+, -, *), and
asks for the final count:

  prompt:   ann has 7 apples . she buys 5 more . she gives away 3 . her apples triple .
            how many apples does ann have ?
  response: 7 + 5 = 12 . 12 - 3 = 9 . 9 * 3 = 27 . #### 27

The response has one step per operation; each step's left operand is the previous result (with
`commute_probability`, a `+` or `*` step may write it second: `05 + 12 = 17`), so the model has
to compute rather than copy, and a problem whose answer also appears as a number in the
prompt is re-drawn. Counts never go below 1 (a subtraction takes at most the current count minus
one). Every problem is a pure function of `(split seed, index)`; a problem that breaks a token
limit is re-drawn from the same generator, so re-drawing is deterministic too. Token counts use
`tokenizer.pretokenize` (one token per digit) and exclude BOS/EOS: `max_response_tokens` leaves
room for the EOS that closes a 32-token block.

Why commuted operands: a block-diffusion model commits every position it is confident about in
one forward. When the data allow two orders, the operand positions of a step are split between
them until one of them is committed, so a confidence-threshold decoder spends extra forwards
on choices that do not change the answer: the under-commitment that ORL's on-policy entropy
contraction removes in real models, whose data always admit several phrasings.
"""
from __future__ import annotations

import dataclasses
import functools
import re

import numpy as np

from orl_jax.data.tokenizer import WordTokenizer, pretokenize
from orl_jax.problem import Problem

_OPS = ("+", "-", "*")
_MAX_DRAWS = 1000  # per problem; a config whose problems never fit stops with a message

# Name -> (subject, object, possessive) pronouns.
_NAMES = {
    "ann": ("she", "her", "her"), "bob": ("he", "him", "his"), "cara": ("she", "her", "her"),
    "dan": ("he", "him", "his"), "eve": ("she", "her", "her"), "finn": ("he", "him", "his"),
    "gus": ("he", "him", "his"), "ivy": ("she", "her", "her"), "jon": ("he", "him", "his"),
    "kim": ("she", "her", "her"), "leo": ("he", "him", "his"), "mia": ("she", "her", "her"),
    "ned": ("he", "him", "his"), "ola": ("she", "her", "her"), "pam": ("she", "her", "her"),
    "raj": ("he", "him", "his"), "sam": ("he", "him", "his"), "tom": ("he", "him", "his"),
    "uma": ("she", "her", "her"), "zoe": ("she", "her", "her"),
}
_OBJECTS = ("apples", "beads", "books", "cards", "coins", "cookies", "eggs", "marbles", "pens",
            "rocks", "shells", "stamps", "stickers", "toys")

# Sentence templates; `{n}` is the operation's number. Fields: name, obj, pron, obj_pron, poss.
_START = ("{name} has {n} {obj}", "{name} starts with {n} {obj}", "{name} owns {n} {obj}")
_STEP = {
    "+": ("{pron} buys {n} more", "{pron} finds {n} more", "{pron} gets {n} more",
          "{pron} wins {n} more", "a friend gives {obj_pron} {n}"),
    "-": ("{pron} gives away {n}", "{pron} loses {n}", "{pron} sells {n}", "{pron} uses {n}"),
    "*": ("{poss} {obj} multiply by {n}", "{pron} multiplies them by {n}"),
}
# Multipliers with a word of their own, so the model also learns `triple` -> `* 3`.
_STEP_WORD_MULTIPLIER = {
    2: ("{poss} {obj} double", "{pron} doubles them"),
    3: ("{poss} {obj} triple", "{pron} triples them"),
}
_THEN = "then"
_THEN_PROBABILITY = 0.25  # chance that a step after the first starts with "then"
_QUESTION = ("how many {obj} does {name} have", "how many {obj} does {pron} have now",
             "how many {obj} now", "how many {obj} in the end")
_SYMBOLS = ("+", "-", "*", "=", "####", ".", "?")

_SPLITS = ("train", "eval")
_STEP_PATTERN = re.compile(r"^(\d+) ([-+*]) (\d+) = (\d+)$")


@dataclasses.dataclass(frozen=True)
class TinyTaskConfig:
  """Difficulty knobs and limits of the tiny task.

  Attributes:
    min_ops: fewest operations per problem.
    max_ops: most operations per problem (4 rarely fits `max_response_tokens=31`).
    max_operand: largest starting count and largest number added or subtracted.
    ops: the operations drawn from, a subset of ("+", "-", "*").
    max_product_operand: largest multiplier (at least 2), small so that results stay short.
    max_value: largest count any step may reach (problems that exceed it are re-drawn); keeps
      every number at two digits by default, which a ~1M-parameter model learns to compute.
    fixed_width: write the response's numbers zero-padded to the width of `max_value`
      (`07 + 05 = 12`), so the response layout never depends on the values: a masked diffusion
      model then only has to compute digits, not to plan how many digit slots each result
      takes before knowing it (with one block of 32 that planning dominated the errors).
    commute_probability: chance that a `+` or `*` step writes its operands in the other order
      (`05 + 12 = 17` instead of `12 + 05 = 17`). Both orders are correct and the layout is the
      same; like the several valid phrasings of natural text, it makes the training data
      multimodal, so a model trained on it hedges between the orders at positions it decodes in
      parallel (see the module docstring).
    max_prompt_tokens: prompt length limit in tokens (digits count one each; no BOS).
    max_response_tokens: response length limit in tokens, without the closing EOS.
    train_seed: seed of the training stream.
    eval_seed: seed of the evaluation stream; must differ from `train_seed`.
    n_eval: size of the fixed evaluation set.
  """
  min_ops: int = 2
  max_ops: int = 3
  max_operand: int = 20
  ops: tuple[str, ...] = _OPS
  max_product_operand: int = 5
  max_value: int = 99
  fixed_width: bool = True
  commute_probability: float = 0.0
  max_prompt_tokens: int = 32
  max_response_tokens: int = 31
  train_seed: int = 0
  eval_seed: int = 1_000_003
  n_eval: int = 512

  def __post_init__(self):
    if not 1 <= self.min_ops <= self.max_ops:
      raise ValueError(f"TinyTaskConfig needs 1 <= min_ops <= max_ops, got min_ops={self.min_ops}"
                       f", max_ops={self.max_ops}.")
    if self.max_operand < 2:
      raise ValueError(f"TinyTaskConfig.max_operand must be at least 2, got {self.max_operand}.")
    if not self.ops or set(self.ops) - set(_OPS):
      raise ValueError(f"TinyTaskConfig.ops must be a non-empty subset of {_OPS}, got {self.ops}.")
    if "+" not in self.ops and "*" not in self.ops:
      raise ValueError(f"TinyTaskConfig.ops={self.ops} has no operation that can grow a count; "
                       "add '+' or '*'.")
    if "*" in self.ops and self.max_product_operand < 2:
      raise ValueError("TinyTaskConfig.max_product_operand must be at least 2 when '*' is in ops, "
                       f"got {self.max_product_operand}.")
    if self.max_value < self.max_operand + 1:
      raise ValueError(f"TinyTaskConfig.max_value={self.max_value} must exceed max_operand="
                       f"{self.max_operand}.")
    if not 0.0 <= self.commute_probability <= 1.0:
      raise ValueError("TinyTaskConfig.commute_probability must be in [0, 1], got "
                       f"{self.commute_probability}.")
    if self.train_seed == self.eval_seed:
      raise ValueError(f"TinyTaskConfig.train_seed and eval_seed are both {self.train_seed}; "
                       "give the evaluation stream its own seed.")
    if self.n_eval < 1:
      raise ValueError(f"TinyTaskConfig.n_eval must be positive, got {self.n_eval}.")


def lexicon() -> frozenset[str]:
  """Every non-digit word the grammar can emit (the tokenizer adds digits and special tokens)."""
  templates = (_START + _QUESTION + sum(_STEP.values(), ())
               + sum(_STEP_WORD_MULTIPLIER.values(), ()))
  words = {w for t in templates for w in t.split() if not w.startswith("{")}
  words |= set(_NAMES) | {p for pronouns in _NAMES.values() for p in pronouns}
  words |= set(_OBJECTS) | set(_SYMBOLS) | {_THEN}
  return frozenset(words)


def count_tokens(text: str) -> int:
  """Length of `text` in tokenizer tokens (each digit is one token), without BOS/EOS."""
  return len(pretokenize(text))


def _split_seed(split: str, cfg: TinyTaskConfig) -> int:
  if split == "train":
    return cfg.train_seed
  if split == "eval":
    return cfg.eval_seed
  raise ValueError(f"Unknown split {split!r}; the tiny task has splits {_SPLITS}.")


def _num(value: int, cfg: TinyTaskConfig) -> str:
  return f"{value:0{len(str(cfg.max_value))}d}" if cfg.fixed_width else str(value)


def _draw(rng: np.random.Generator, cfg: TinyTaskConfig) -> tuple[str, str, int]:
  """One candidate problem as (prompt, response, answer); limits are checked by the caller."""
  def pick(options):
    return options[int(rng.integers(len(options)))]

  name = pick(tuple(_NAMES))
  pron, obj_pron, poss = _NAMES[name]
  fields = dict(name=name, obj=pick(_OBJECTS), pron=pron, obj_pron=obj_pron, poss=poss)

  count = int(rng.integers(2, cfg.max_operand + 1))
  sentences = [pick(_START).format(n=count, **fields)]
  steps = []
  n_ops = int(rng.integers(cfg.min_ops, cfg.max_ops + 1))
  for step in range(n_ops):
    feasible = [op for op in cfg.ops if op != "-" or count >= 2]  # counts stay >= 1
    op = pick(feasible)
    if op == "+":
      n = int(rng.integers(1, cfg.max_operand + 1))
      result = count + n
    elif op == "-":
      n = int(rng.integers(1, min(cfg.max_operand, count - 1) + 1))
      result = count - n
    else:
      n = int(rng.integers(2, cfg.max_product_operand + 1))
      result = count * n
    templates = _STEP[op] + (_STEP_WORD_MULTIPLIER.get(n, ()) if op == "*" else ())
    sentence = pick(templates).format(n=n, **fields)
    if step > 0 and rng.random() < _THEN_PROBABILITY:
      sentence = f"{_THEN} {sentence}"
    sentences.append(sentence)
    left, right = _num(count, cfg), _num(n, cfg)
    # The extra draw only happens when commuting is on, so streams without it stay unchanged.
    if op != "-" and cfg.commute_probability > 0 and rng.random() < cfg.commute_probability:
      left, right = right, left
    steps.append(f"{left} {op} {right} = {_num(result, cfg)}")
    count = result
  if max(int(s.split()[-1]) for s in steps) > cfg.max_value:
    return "", "", -1  # rejected by the caller (too large)
  prompt = " . ".join(sentences) + " . " + pick(_QUESTION).format(**fields) + " ?"
  response = " . ".join(steps) + f" . #### {_num(count, cfg)}"
  return prompt, response, count


def generate_problem(index: int, split: str,
                     cfg: TinyTaskConfig = TinyTaskConfig()) -> Problem:
  """The problem at `index` of `split` ("train" or "eval"); deterministic in (seed, index).

  Candidates are drawn from `np.random.default_rng([seed, index])` until one fits the token
  limits and its answer is not among the prompt's numbers.
  """
  if index < 0:
    raise ValueError(f"Problem index must be non-negative, got {index}.")
  rng = np.random.default_rng([_split_seed(split, cfg), index])
  for _ in range(_MAX_DRAWS):
    prompt, response, answer = _draw(rng, cfg)
    if answer >= 0 and (count_tokens(prompt) <= cfg.max_prompt_tokens
        and count_tokens(response) <= cfg.max_response_tokens
        and str(answer) not in prompt.split()):
      return Problem(problem_id=f"tiny-{split}-{index}", prompt=prompt, target=response,
                     answer=str(answer))
  raise ValueError(f"No tiny-task problem fit max_prompt_tokens={cfg.max_prompt_tokens} and "
                   f"max_response_tokens={cfg.max_response_tokens} in {_MAX_DRAWS} draws; raise "
                   "the limits or lower max_ops / max_operand / max_product_operand.")


def train_problem(index: int, cfg: TinyTaskConfig = TinyTaskConfig()) -> Problem:
  """The training problem at `index` (an unbounded stream)."""
  return generate_problem(index, "train", cfg)


def eval_problems(cfg: TinyTaskConfig = TinyTaskConfig()) -> list[Problem]:
  """The fixed evaluation set: indices 0..n_eval-1 of the evaluation stream."""
  return [generate_problem(i, "eval", cfg) for i in range(cfg.n_eval)]


def parse_steps(response: str) -> list[tuple[int, str, int, int]]:
  """Parses a response's chain of thought into (left, op, right, result) steps.

  Stops at `####`; raises ValueError on a step that is not `a op b = c`. Used by tests and
  diagnostics, not by the verifier (which only reads the final answer).
  """
  body = response.split("####")[0]
  steps = []
  for sentence in filter(None, (s.strip() for s in body.split(" ."))):
    match = _STEP_PATTERN.match(sentence)
    if match is None:
      raise ValueError(f"Step {sentence!r} is not of the form 'a op b = c'.")
    left, op, right, result = match.groups()
    steps.append((int(left), op, int(right), int(result)))
  return steps


@functools.lru_cache(maxsize=None)
def tiny_tokenizer() -> WordTokenizer:
  """The tokenizer of the tiny task (one vocabulary for every `TinyTaskConfig`)."""
  return WordTokenizer(lexicon())


def tokenizer_for(cfg) -> WordTokenizer:
  """The tokenizer for a `TinyTaskConfig`.

  The lexicon is the whole grammar's, independent of the difficulty knobs, so every config shares
  one vocabulary (and `vocab_hash`).
  """
  del cfg  # Deliberately config-independent; see the docstring.
  return tiny_tokenizer()
